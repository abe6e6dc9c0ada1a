//! A real headless browser for the viewer page tests: chromedriver in its
//! own process group (dropped, the group is killed, the browser with it)
//! and a Chromium session through it.
//!
//! Needs `chromium` and `chromedriver` (Debian: `chromium`,
//! `chromium-driver`); a test fails, not skips, without them.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::free_port;

const INSTALL_HINT: &str = ".ci/run installs chromium and chromium-driver";

/// How long the page may take to show something it should show.
pub const PAGE_WAIT: Duration = Duration::from_secs(30);
/// How long chromedriver and the browser may take to start.
const START_WAIT: Duration = Duration::from_secs(30);

/// `name` on PATH, else the first of `fallbacks` that exists.
fn find_binary(name: &str, fallbacks: &[&str]) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name));
    on_path
        .chain(fallbacks.iter().map(PathBuf::from))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not on PATH nor at {fallbacks:?}; {INSTALL_HINT}"))
}

/// A chromedriver process and one browser session of it.
pub struct Browser {
    child: Child,
    pub client: Client,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium `width` × `height`.
    pub async fn start(width: u32, height: u32) -> Self {
        let chromedriver = find_binary("chromedriver", &["/usr/bin/chromedriver"]);
        let chromium = find_binary("chromium", &["/usr/bin/chromium"]);
        let mut last = String::new();
        // The free port may be taken before chromedriver binds it: retry.
        for _ in 0..3 {
            let port = free_port();
            let mut child = Command::new(&chromedriver)
                .arg(format!("--port={port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}; {INSTALL_HINT}", chromedriver.display()));
            let url = format!("http://127.0.0.1:{port}");
            match ready(&mut child, &url).await {
                Ok(()) => {
                    let client = session(&url, &chromium, width, height).await;
                    return Self { child, client };
                }
                Err(why) => {
                    last = why;
                    kill_group(&mut child);
                }
            }
        }
        panic!("chromedriver did not start: {last}");
    }

    /// Runs `script` (a function body: `return …`) in the page.
    pub async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("running {script:?}: {e}"))
    }

    /// Opens `url`.
    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap_or_else(|e| panic!("opening {url}: {e}"));
    }

    /// The page as a PNG.
    pub async fn screenshot(&self) -> Vec<u8> {
        self.client.screenshot().await.unwrap_or_else(|e| panic!("taking a screenshot: {e}"))
    }

    /// Polls `script` every 20 ms until it returns something other than
    /// `null`, `false` or `undefined`, for at most `wait`: its value, or
    /// `None` once `wait` passed.
    pub async fn within(&self, wait: Duration, script: &str) -> Option<Value> {
        let deadline = Instant::now() + wait;
        loop {
            let value = self.js(script).await;
            if !matches!(value, Value::Null | Value::Bool(false)) {
                return Some(value);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls `script` until it returns something other than `null`,
    /// `false` or `undefined`; panics with `what` after [`PAGE_WAIT`].
    pub async fn until(&self, what: &str, script: &str) -> Value {
        if let Some(value) = self.within(PAGE_WAIT, script).await {
            return value;
        }
        let status = self.js("return document.getElementById('status').textContent").await;
        panic!("the page never showed {what} within {PAGE_WAIT:?} (status {status})");
    }

    /// The texts of the log lines in the DOM now, in order.
    pub async fn shown_lines(&self) -> Vec<String> {
        let value = self.js("return [...document.querySelectorAll('#log .tx')].map((l) => l.textContent);").await;
        serde_json::from_value(value).unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        kill_group(&mut self.child);
    }
}

fn kill_group(child: &mut Child) {
    // The group id is chromedriver's pid (process_group(0)).
    let group = format!("-{}", child.id());
    let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits until chromedriver answers `/status` with `ready: true`.
async fn ready(child: &mut Child, url: &str) -> Result<(), String> {
    let http = super::http_client();
    let deadline = Instant::now() + START_WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!("it exited with {status}"));
        }
        let answer = http.get(format!("{url}/status")).timeout(Duration::from_secs(2)).send().await;
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

async fn session(url: &str, chromium: &std::path::Path, width: u32, height: u32) -> Client {
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            // CI runs as root in a container: no sandbox, small /dev/shm.
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     format!("--window-size={width},{height}"), "--enable-precise-memory-info"],
        },
    });
    let Value::Object(capabilities) = capabilities else { unreachable!() };
    let mut builder = ClientBuilder::new(HttpConnector::new());
    builder.capabilities(capabilities);
    match tokio::time::timeout(START_WAIT, builder.connect(url)).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => panic!("cannot start {} through chromedriver: {e}; {INSTALL_HINT}", chromium.display()),
        Err(_) => panic!("the browser did not start within {START_WAIT:?}"),
    }
}
