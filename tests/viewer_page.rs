//! The viewer page served at `/` in a real headless browser: opened on a
//! run, it keeps showing the run's output, including lines produced after
//! the page opened.
//!
//! Needs `chromium` and `chromedriver` (Debian: `chromium`,
//! `chromium-driver`); the test fails, not skips, without them.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::logs::*;
use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use tokio::time::Instant;

const INSTALL_HINT: &str = ".ci/run installs chromium and chromium-driver";

/// How long the page may take to show something it should show.
const PAGE_WAIT: Duration = Duration::from_secs(20);
/// How long chromedriver and the browser may take to start.
const START_WAIT: Duration = Duration::from_secs(30);

/// `name` on PATH, else the first of `fallbacks` that exists.
fn find_binary(name: &str, fallbacks: &[&str]) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name));
    on_path.chain(fallbacks.iter().map(PathBuf::from)).find(|p| p.is_file())
}

use common::free_port;

/// A chromedriver process in its own process group; dropping it kills the
/// group, so the browser it started goes too, even when the test fails.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    async fn start(chromedriver: &Path) -> Self {
        let mut last = String::new();
        // The free port may be taken before chromedriver binds it: retry.
        for _ in 0..3 {
            let port = free_port();
            let child = Command::new(chromedriver)
                .arg(format!("--port={port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}; {INSTALL_HINT}", chromedriver.display()));
            let mut driver = Driver { child, url: format!("http://127.0.0.1:{port}") };
            match driver.ready().await {
                Ok(()) => return driver,
                Err(why) => last = why,
            }
        }
        panic!("chromedriver did not start: {last}");
    }

    /// Waits until chromedriver answers `/status` with `ready: true`.
    async fn ready(&mut self) -> Result<(), String> {
        let http = common::http_client();
        let deadline = Instant::now() + START_WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(format!("it exited with {status}"));
            }
            let answer = http.get(format!("{}/status", self.url)).timeout(Duration::from_secs(2)).send().await;
            if let Ok(response) = answer
                && let Ok(body) = response.json::<Value>().await
                && body["value"]["ready"] == true
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("not ready within {START_WAIT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A headless browser session.
    async fn session(&self, chromium: &Path) -> Client {
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                // CI runs as root in a container: no sandbox, small /dev/shm.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            },
        });
        let Value::Object(capabilities) = capabilities else { unreachable!() };
        let mut builder = ClientBuilder::new(HttpConnector::new());
        builder.capabilities(capabilities);
        match tokio::time::timeout(START_WAIT, builder.connect(&self.url)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => panic!("cannot start {} through chromedriver: {e}; {INSTALL_HINT}", chromium.display()),
            Err(_) => panic!("the browser did not start within {START_WAIT:?}"),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The group id is chromedriver's pid (process_group(0)).
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the page shows: the text of `#log` and of `#status`.
async fn shown(client: &Client) -> (String, String) {
    let script = "return [document.getElementById('log').textContent, document.getElementById('status').textContent];";
    let value = client.execute(script, vec![]).await.expect("reading the page");
    let text = |i: usize| value[i].as_str().unwrap_or_default().to_string();
    (text(0), text(1))
}

/// Polls the page until `check(log, status)` holds; panics with what the
/// page shows after `PAGE_WAIT`.
async fn until(client: &Client, what: &str, check: impl Fn(&str, &str) -> bool) -> (String, String) {
    let deadline = Instant::now() + PAGE_WAIT;
    loop {
        let (log, status) = shown(client).await;
        if check(&log, &status) {
            return (log, status);
        }
        if Instant::now() >= deadline {
            panic!("the page never showed {what} within {PAGE_WAIT:?}; status {status:?}, log {log:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The page opened on a run appends output produced after it opened, in
/// order, and reports the end of the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_page_shows_lines_produced_after_it_opened() {
    let chromedriver = find_binary("chromedriver", &["/usr/bin/chromedriver"])
        .unwrap_or_else(|| panic!("chromedriver is not on PATH nor at /usr/bin/chromedriver; {INSTALL_HINT}"));
    let chromium = find_binary("chromium", &["/usr/bin/chromium"])
        .unwrap_or_else(|| panic!("chromium is not on PATH nor at /usr/bin/chromium; {INSTALL_HINT}"));

    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.test", "r-1", "written before the page opened\n").await;
    // A run without a status ends its stream after a short quiet time; a
    // running one is followed until it finishes, however slow the browser.
    server.state("svc.test", "r-1", "running").await;

    let driver = Driver::start(&chromedriver).await;
    let client = driver.session(&chromium).await;
    client.goto(&format!("{}/?fqn=svc.test&run=r-1", server.base)).await.expect("opening the viewer page");

    until(&client, "the line written before it opened", |log, _| log.contains("written before the page opened")).await;

    server.lines("svc.test", "r-1", "produced after the page opened 1\n").await;
    server.lines("svc.test", "r-1", "produced after the page opened 2\n").await;
    let (log, status) =
        until(&client, "the lines produced after it opened", |log, _| log.contains("produced after the page opened 2"))
            .await;
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        ["written before the page opened", "produced after the page opened 1", "produced after the page opened 2"],
        "the log as shown (status {status:?})"
    );

    server.state("svc.test", "r-1", "success").await;
    until(&client, "the end of the run", |_, status| status == "run finished").await;

    client.close().await.expect("closing the browser");
    drop(driver);
}
