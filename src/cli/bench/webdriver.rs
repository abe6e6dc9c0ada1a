//! Just enough WebDriver for `bench viewer`: chromedriver in its own process
//! group (killed with the group when dropped, the browser with it) and one
//! headless Chromium session, spoken to over HTTP (the W3C protocol's
//! `session`, `url`, `execute/sync` and `screenshot`).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use serde_json::{Value, json};

pub struct WebDriver {
    http: reqwest::Client,
    session: String,
    child: Child,
}

/// `name` on PATH, else the first of `fallbacks` that exists.
fn find(name: &str, fallbacks: &[&str]) -> anyhow::Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name));
    on_path
        .chain(fallbacks.iter().map(PathBuf::from))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} is not on PATH (Debian: apt-get install chromium chromium-driver)"))
}

impl WebDriver {
    /// Starts chromedriver and a headless Chromium window `width` × `height`.
    pub async fn start(width: u32, height: u32) -> anyhow::Result<Self> {
        let chromedriver = find("chromedriver", &["/usr/bin/chromedriver"])?;
        let chromium = find("chromium", &["/usr/bin/chromium"])?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .with_context(|| format!("running {}", chromedriver.display()))?;
        let mut driver = Self { http: reqwest::Client::new(), session: format!("http://127.0.0.1:{port}"), child };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = driver.http.get(format!("{}/status", driver.session)).send().await;
            if let Ok(answer) = ready
                && let Ok(body) = answer.json::<Value>().await
                && body["value"]["ready"] == true
            {
                break;
            }
            if Instant::now() >= deadline {
                bail!("chromedriver did not start within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         format!("--window-size={width},{height}"), "--enable-precise-memory-info"],
            },
        }}});
        let answer: Value =
            driver.http.post(format!("{}/session", driver.session)).json(&capabilities).send().await?.json().await?;
        let id = answer["value"]["sessionId"].as_str().with_context(|| format!("no session: {answer}"))?;
        driver.session = format!("{}/session/{id}", driver.session);
        Ok(driver)
    }

    async fn call(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let answer: Value = self.http.post(format!("{}/{path}", self.session)).json(&body).send().await?.json().await?;
        if answer["value"].get("error").is_some() {
            bail!("webdriver {path}: {}", answer["value"]);
        }
        Ok(answer["value"].clone())
    }

    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.call("url", json!({ "url": url })).await.map(drop)
    }

    /// Runs `script` (a function body: `return …`) in the page.
    pub async fn js(&self, script: &str) -> anyhow::Result<Value> {
        self.call("execute/sync", json!({ "script": script, "args": [] })).await
    }

    /// Polls `script` until it returns something other than `null` or
    /// `false`, for at most `wait`.
    pub async fn until(&self, script: &str, wait: Duration) -> anyhow::Result<Value> {
        let deadline = Instant::now() + wait;
        loop {
            let value = self.js(script).await?;
            if !matches!(value, Value::Null | Value::Bool(false)) {
                return Ok(value);
            }
            if Instant::now() >= deadline {
                bail!("not within {wait:?}: {script}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The page as a PNG.
    pub async fn screenshot(&self) -> anyhow::Result<Vec<u8>> {
        let answer: Value = self.http.get(format!("{}/screenshot", self.session)).send().await?.json().await?;
        let encoded = answer["value"].as_str().context("no screenshot")?;
        Ok(base64::engine::general_purpose::STANDARD.decode(encoded)?)
    }
}

impl Drop for WebDriver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
