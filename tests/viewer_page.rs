//! The viewer page served at `/` in a real headless browser: opened on a
//! run, it keeps showing the run's output, including lines produced after
//! the page opened.
//!
//! Needs `chromium` and `chromedriver` (Debian: `chromium`,
//! `chromium-driver`); the test fails, not skips, without them.

use tailrace_testkit as common;

use common::browser::Browser;
use common::logs::*;

/// The page opened on a run appends output produced after it opened, in
/// order, and reports the end of the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_page_shows_lines_produced_after_it_opened() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.test", "r-1", "written before the page opened\n").await;
    // A run without a status ends its stream after a short quiet time; a
    // running one is followed until it finishes, however slow the browser.
    server.state("svc.test", "r-1", "running").await;

    let browser = Browser::start(1280, 800).await;
    browser.client.goto(&format!("{}/?fqn=svc.test&run=r-1", server.base)).await.expect("opening the viewer page");
    let has = |text: &str| {
        format!("return [...document.querySelectorAll('#log .tx')].some((l) => l.textContent === '{text}')")
    };
    browser.until("the line written before it opened", &has("written before the page opened")).await;

    server.lines("svc.test", "r-1", "produced after the page opened 1\n").await;
    server.lines("svc.test", "r-1", "produced after the page opened 2\n").await;
    browser.until("the lines produced after it opened", &has("produced after the page opened 2")).await;
    assert_eq!(
        browser.shown_lines().await,
        ["written before the page opened", "produced after the page opened 1", "produced after the page opened 2"],
        "the log as shown"
    );

    server.state("svc.test", "r-1", "success").await;
    browser
        .until("the end of the run", "return document.getElementById('status').textContent === 'run finished'")
        .await;
    browser
        .until(
            "the run's status in the header",
            "return document.getElementById('run-state').textContent === 'success'",
        )
        .await;
}
