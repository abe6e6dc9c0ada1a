//! The viewer page's features in a real headless Chromium, one test each:
//! ANSI colours (and no HTML from log text), folding groups, following a
//! live run, and a run of a million lines (opened at its tail, a link to a
//! line 900 000 back, search in parts never loaded, a bounded DOM), the
//! keys, the live run list, preferences kept across a reload, repeated
//! lines, a failed run opened at its first error, and the comparison with
//! the last success.

use tailrace_testkit as common;

use common::browser::Browser;
use common::logs::*;
use serde_json::Value;
use tailrace::SequenceToken;
use tailrace::archive::{Append, RunKey, RunLogStore, RunState};

fn page(server: &LogServer, fqn: &str, run: &str) -> String {
    format!("{}/?fqn={fqn}&run={run}", server.base)
}

/// Whether the line numbered `n` is in the DOM and inside the log's box.
fn line_in_view(n: u64) -> String {
    format!(
        "const box = document.getElementById('log').getBoundingClientRect();
         const row = [...document.querySelectorAll('#log .ln')].find((l) => l.dataset.n === '{n}');
         if (!row || row.classList.contains('gap')) return false;
         const r = row.getBoundingClientRect();
         return r.top >= box.top - 1 && r.bottom <= box.bottom + 1 ? row.querySelector('.tx').textContent : false;"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colours_render_and_log_text_never_becomes_html() {
    let server = LogServer::start(quick_settings()).await;
    let lines = [
        "\x1b[31mERROR\x1b[0m disk full",
        "\x1b[1;38;5;208mbold orange\x1b[0m and \x1b[38;2;10;20;30mtrue colour\x1b[0m",
        "<script>window.pwned = 1</script>",
        "\"><img src=x onerror=\"window.pwned = 2\">",
        "progress 10%\rprogress 55%\rprogress 100%",
        "\x1b]0;a window title\x07\x1b[2Kplain after escapes",
    ];
    server.lines("svc.ansi", "r-1", &lines.join("\n")).await;
    server.state("svc.ansi", "r-1", "running").await;
    let browser = Browser::start(1280, 800).await;
    browser.client.goto(&page(&server, "svc.ansi", "r-1")).await.unwrap();
    browser.until("six lines", "return document.querySelectorAll('#log .ln:not(.gap)').length >= 6").await;

    assert_eq!(
        browser.shown_lines().await,
        [
            "ERROR disk full",
            "bold orange and true colour",
            "<script>window.pwned = 1</script>",
            "\"><img src=x onerror=\"window.pwned = 2\">",
            "progress 100%",
            "plain after escapes",
        ]
    );
    let style = |text: &str, property: &str| {
        format!(
            "const span = [...document.querySelectorAll('#log .tx span')].find((s) => s.textContent === '{text}');
             return span ? getComputedStyle(span).{property} : null;"
        )
    };
    assert_eq!(browser.js(&style("ERROR", "color")).await, "rgb(192, 40, 45)", "red in the light palette");
    assert_eq!(browser.js(&style("bold orange", "color")).await, "rgb(255, 135, 0)", "256-colour 208");
    assert_eq!(browser.js(&style("bold orange", "fontWeight")).await, "700");
    assert_eq!(browser.js(&style("true colour", "color")).await, "rgb(10, 20, 30)");
    assert_eq!(
        browser.js("return window.pwned === undefined && !document.querySelector('#log img, #log script')").await,
        true
    );
    assert_eq!(
        browser.js("return document.querySelector('#log .ln').classList.contains('err')").await,
        true,
        "a gutter mark"
    );

    // Dark mode (the toggle; the OS preference picks the first theme).
    browser.js("document.getElementById('theme').click(); return true").await;
    let dark = browser.js("return document.documentElement.dataset.theme").await;
    let red = browser.js(&style("ERROR", "color")).await;
    assert_eq!(dark, "dark");
    assert_eq!(red, "rgb(255, 123, 114)", "red in the dark palette");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_groups_fold_and_open_on_a_click() {
    let server = LogServer::start(quick_settings()).await;
    let lines = [
        "before",
        "::group::Build",
        "compile a",
        "compile b",
        "::endgroup::",
        "section_start:1700000000:deploy\r\x1b[0KDeploying",
        "d1",
        "section_end:1700000001:deploy\r\x1b[0K",
        "::group::Test",
        "t1",
    ];
    server.lines("svc.groups", "r-1", &lines.join("\n")).await;
    server.state("svc.groups", "r-1", "running").await;
    let browser = Browser::start(1280, 800).await;
    browser.client.goto(&page(&server, "svc.groups", "r-1")).await.unwrap();
    // (Each group's duration, once its times came, left out.)
    let folded = "return JSON.stringify([...document.querySelectorAll('#log .ln')].map((l) => {
                    const tx = l.querySelector('.tx').cloneNode(true);
                    tx.querySelectorAll('.dur').forEach((d) => d.remove());
                    return tx.textContent;
                  }))";
    let want = r#"["before","Build2 lines","Deploying1 lines","Test1 lines","t1"]"#;
    let shown = browser
        .until("the groups folded", &format!("const s = (() => {{ {folded} }})(); return s === '{want}' ? s : false"))
        .await;
    assert_eq!(shown, want, "finished groups fold, the live tail's stays open, end markers never show");
    let click = |title: &str| {
        format!(
            "const row = [...document.querySelectorAll('#log .ln.grp')].find((l) => l.querySelector('.tx').firstChild.textContent === '{title}');
             const box = row.querySelector('.tx').getBoundingClientRect();
             row.dispatchEvent(new MouseEvent('click', {{ bubbles: true, clientX: box.left + 5, clientY: box.top + 5 }}));
             return true;"
        )
    };
    browser.js(&click("Build")).await;
    browser
        .until(
            "Build opened",
            "return [...document.querySelectorAll('#log .tx')].some((t) => t.textContent === 'compile b')",
        )
        .await;
    browser.js(&click("Build")).await;
    browser
        .until(
            "Build folded again",
            "return ![...document.querySelectorAll('#log .tx')].some((t) => t.textContent === 'compile b')",
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_keeps_the_last_line_in_view_while_lines_arrive() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.follow", "r-1", "first").await;
    server.state("svc.follow", "r-1", "running").await;
    let browser = Browser::start(1024, 600).await;
    browser.client.goto(&page(&server, "svc.follow", "r-1")).await.unwrap();
    browser.until("the first line", &line_in_view(1)).await;
    let mut total = 1u64;
    for batch in 0..30 {
        let body: Vec<String> = (0..40).map(|i| format!("batch {batch} line {i}")).collect();
        server.lines("svc.follow", "r-1", &body.join("\n")).await;
        total += 40;
        if batch % 10 == 9 {
            let text = browser.until(&format!("line {total} in view"), &line_in_view(total)).await;
            assert_eq!(text, format!("batch {batch} line 39"));
        }
    }
    let rows = browser.js("return document.querySelectorAll('#log .ln').length").await.as_u64().unwrap();
    assert!(rows < 200, "{rows} line elements for {total} lines: only those near the viewport");
}

/// Appends `n` lines straight to the store (as the archiver would, in
/// containers of 10 000): line `i` (1-based) reads `line i ok`, but for a
/// few marked ones.
async fn million(server: &LogServer, run: &RunKey, n: u64) {
    let mut at = 0u64;
    while at < n {
        let lines: Vec<String> = (at + 1..=(at + 10_000).min(n))
            .map(|i| match i {
                12_345 => format!("line {i} needle-in-the-haystack"),
                500_000 => format!("line {i} \x1b[31merror:\x1b[0m something broke"),
                _ => format!("line {i} ok"),
            })
            .collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        server.store.append(run, SequenceToken::new(0, at), &refs, Append::new()).await.unwrap();
        at += lines.len() as u64;
    }
    server.store.set_state(run, RunState::Success).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_line_run_opens_at_its_tail_and_any_line_is_a_link_away() {
    let server = LogServer::start(quick_settings()).await;
    let run = RunKey::new("svc.big", "r-1").unwrap();
    million(&server, &run, 1_000_000).await;
    let browser = Browser::start(1280, 800).await;

    // Opened at its tail, with the DOM bounded.
    browser.client.goto(&page(&server, "svc.big", "r-1")).await.unwrap();
    let last = browser.until("the last line", &line_in_view(1_000_000)).await;
    assert_eq!(last, "line 1000000 ok");
    let lines = browser.js("return document.querySelectorAll('#log .ln').length").await.as_u64().unwrap();
    assert!(lines <= 5_000, "{lines} line elements");

    // A link 900 000 lines back: that line, selected, in view.
    browser.client.goto(&format!("{}#L100000", page(&server, "svc.big", "r-1"))).await.unwrap();
    let linked = browser.until("line 100 000", &line_in_view(100_000)).await;
    assert_eq!(linked, "line 100000 ok");
    let selected = "return [...document.querySelectorAll('#log .ln.sel')].map((l) => l.dataset.n)";
    assert_eq!(browser.js(selected).await, Value::from(vec!["100000"]));
    // A range, and a shift-click on a line number that extends it.
    browser.client.goto(&format!("{}#L100000-L100002", page(&server, "svc.big", "r-1"))).await.unwrap();
    browser.until("the range", &format!("const s = (() => {{ {selected} }})(); return s.length === 3 && s")).await;
    let shift_click = "const row = [...document.querySelectorAll('#log .ln')].find((l) => l.dataset.n === '100004');
                       const box = row.getBoundingClientRect();
                       row.dispatchEvent(new MouseEvent('click', { bubbles: true, shiftKey: true, clientX: box.left + 3, clientY: box.top + 5 }));
                       return location.hash";
    assert_eq!(browser.js(shift_click).await, "#L100000-L100004", "the address follows the selection");

    // Search finds a line in a part never loaded, and jumps to it.
    browser.js("const q = document.getElementById('q'); q.value = 'NEEDLE-in'; document.getElementById('find').requestSubmit(); return true").await;
    let found = browser.until("the match in view", &line_in_view(12_345)).await;
    assert_eq!(found, "line 12345 needle-in-the-haystack");
    assert_eq!(browser.js("return document.getElementById('hits').textContent").await, "1 / 1");
    let marked = "return [...document.querySelectorAll('#log mark')].map((m) => m.textContent)";
    assert_eq!(browser.js(marked).await, Value::from(vec!["needle-in"]));

    // The next error, and the count per level in the header.
    browser.js("document.getElementById('next-error').click(); return true").await;
    let error = browser.until("the error in view", &line_in_view(500_000)).await;
    assert_eq!(error, "line 500000 error: something broke");
    let levels = browser
        .until(
            "the level counts",
            "const t = document.getElementById('levels').textContent; return t.startsWith('1 error · ') && t",
        )
        .await;
    assert!(levels.as_str().unwrap().contains("0 warnings"), "{levels}");
    let lines = browser.js("return document.querySelectorAll('#log .ln').length").await.as_u64().unwrap();
    assert!(lines <= 5_000, "{lines} line elements after the jumps");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_line_shows_when_it_arrived_on_the_clock_or_since_the_start() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.times", "r-1", "first\nfirst too").await;
    // Two ingest times at least a second apart (the input, not a wait).
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    server.lines("svc.times", "r-1", "second").await;
    server.state("svc.times", "r-1", "running").await;
    server.archived("svc.times", "r-1", 3).await;
    let browser = Browser::start(1280, 800).await;
    browser.client.goto(&page(&server, "svc.times", "r-1")).await.unwrap();
    browser.until("three lines", "return document.querySelectorAll('#log .ln:not(.gap)').length >= 3").await;
    let stamps = "const t = [...document.querySelectorAll('#log .ts')].map((s) => s.textContent);
                  return t.length === 3 && t.every((s) => s !== '') ? t : false";
    browser.js("document.getElementById('times').click(); return true").await;
    let clock: Vec<String> = serde_json::from_value(browser.until("clock times", stamps).await).unwrap();
    let pattern = regex::Regex::new(r"^\d\d:\d\d:\d\d\.\d{3}$").unwrap();
    assert!(clock.iter().all(|t| pattern.is_match(t)), "{clock:?}");
    assert_eq!(clock[0], clock[1], "one request, one arrival time");
    browser.js("document.getElementById('times').click(); return true").await;
    let since = browser
        .until(
            "times since the start",
            &format!("const t = (() => {{ {stamps} }})(); return t && t[0].startsWith('+') && t"),
        )
        .await;
    let since: Vec<String> = serde_json::from_value(since).unwrap();
    assert_eq!(since[0], "+0:00.000");
    let seconds: f64 = since[2].trim_start_matches("+0:").parse().unwrap();
    assert!((1.1..60.0).contains(&seconds), "{since:?}");
    browser.js("document.getElementById('times').click(); return true").await;
    browser.until("times off", "return document.querySelectorAll('#log .ts').length === 0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phone_width_screen_gets_the_whole_page_and_coloured_run_states() {
    let server = LogServer::start(quick_settings()).await;
    server
        .lines("svc.phone", "ok-run", "a line that is long enough to need more than a phone's width to show it whole")
        .await;
    server.state("svc.phone", "ok-run", "success").await;
    server.lines("svc.phone", "bad-run", "boom").await;
    server.state("svc.phone", "bad-run", "failed").await;
    let browser = Browser::start(390, 844).await;
    browser.client.goto(&page(&server, "svc.phone", "ok-run")).await.unwrap();
    browser.until("the line", &line_in_view(1)).await;
    let fits = "return document.documentElement.scrollWidth <= window.innerWidth
                && document.getElementById('log').getBoundingClientRect().height > 100";
    assert_eq!(browser.js(fits).await, true, "no sideways scroll of the page; the log keeps room");
    let states = "const o = [...document.querySelectorAll('#run option')];
                  return o.length === 2 ? o.map((x) => [x.value, getComputedStyle(x).color]) : false";
    let states = browser.until("both runs listed", states).await;
    let states: Vec<(String, String)> = serde_json::from_value(states).unwrap();
    let colour = |run: &str| states.iter().find(|(r, _)| r == run).map(|(_, c)| c.clone()).unwrap();
    assert_eq!(colour("ok-run"), "rgb(29, 122, 58)", "success is green");
    assert_eq!(colour("bad-run"), "rgb(179, 38, 30)", "failed is red");
}

/// The keys: `/` puts the cursor in the search box, `n` and `N` go through
/// the matches, `g` asks for a line and selects it, `End` follows again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keyboard_searches_goes_to_a_line_and_follows() {
    let server = LogServer::start(quick_settings()).await;
    let lines: Vec<String> =
        (1..=400).map(|i| if i % 100 == 0 { format!("line {i} marker") } else { format!("line {i}") }).collect();
    server.lines("svc.keys", "r-1", &lines.join("\n")).await;
    server.state("svc.keys", "r-1", "running").await;
    let browser = Browser::start(1280, 800).await;
    browser.client.goto(&page(&server, "svc.keys", "r-1")).await.unwrap();
    browser.until("the last line", &line_in_view(400)).await;
    let press = |key: &str| {
        format!(
            "document.body.dispatchEvent(new KeyboardEvent('keydown', {{ key: '{key}', bubbles: true }}));
             return document.activeElement ? document.activeElement.id : ''"
        )
    };
    assert_eq!(browser.js(&press("/")).await, "q", "`/` puts the cursor in the search box");
    browser
        .js("const q = document.getElementById('q'); q.value = 'marker'; document.getElementById('find').requestSubmit();
             q.dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: true })); return true")
        .await;
    let hits = "const t = document.getElementById('hits').textContent; return /^\\d \\/ 4$/.test(t) && t";
    let first: u64 = browser.until("four matches", hits).await.as_str().unwrap()[..1].parse().unwrap();
    browser.until("the match in view", &line_in_view(first * 100)).await;
    browser.js(&press("n")).await;
    let second = first % 4 + 1;
    assert_eq!(
        browser.until("the next match", &line_in_view(second * 100)).await,
        format!("line {} marker", second * 100)
    );
    assert_eq!(browser.js("return document.getElementById('hits').textContent").await, format!("{second} / 4"));
    browser.js(&press("N")).await;
    browser.until("the match before", &line_in_view(first * 100)).await;

    // `g` asks for a line number (the prompt answered here) and selects it.
    browser.js(&format!("window.prompt = () => '250'; {}", press("g"))).await;
    assert_eq!(browser.until("line 250", &line_in_view(250)).await, "line 250");
    assert_eq!(browser.js("return location.hash").await, "#L250");

    // `End` follows the live tail again.
    browser.js(&press("End")).await;
    browser.until("the tail", &line_in_view(400)).await;
    server.lines("svc.keys", "r-1", "line 401 after End").await;
    assert_eq!(browser.until("the new line", &line_in_view(401)).await, "line 401 after End");
}

/// The run list follows the pipeline's runs stream: a run started after
/// the page opened appears, and its state changes show, without a reload;
/// the page stays on its run until "follow the newest run" is on, then
/// opens the next run that starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_list_follows_the_pipeline_and_can_follow_the_newest_run() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.live", "r-1", "first run").await;
    server.state("svc.live", "r-1", "running").await;
    let browser = Browser::start(1280, 800).await;
    browser.goto(&page(&server, "svc.live", "r-1")).await;
    assert_eq!(browser.until("the first run's line", &line_in_view(1)).await, "first run");
    let listed = |entry: &str| {
        format!(
            "const o = [...document.querySelectorAll('#run option')].map((o) => o.value + ' ' + o.className);
             return o.includes('{entry}') && o"
        )
    };
    browser.until("r-1 listed", &listed("r-1 state-running")).await;

    server.lines("svc.live", "r-2", "second run").await;
    server.state("svc.live", "r-2", "running").await;
    browser.until("r-2 listed, running", &listed("r-2 state-running")).await;
    server.state("svc.live", "r-2", "failed").await;
    let options = browser.until("r-2 failed", &listed("r-2 state-failed")).await;
    assert_eq!(options, serde_json::json!(["r-2 state-failed", "r-1 state-running"]), "newest first");
    assert_eq!(browser.js("return document.getElementById('run').value").await, "r-1", "still on its run");
    assert_eq!(browser.js(&line_in_view(1)).await, "first run");

    browser.js("document.getElementById('newest').click(); return true").await;
    server.lines("svc.live", "r-3", "third run").await;
    let opened = format!("const t = (() => {{ {} }})(); return t === 'third run' && location.search", line_in_view(1));
    let address = browser.until("r-3 opened", &opened).await;
    assert!(address.as_str().unwrap().contains("run=r-3"), "{address}");
    assert_eq!(browser.js("return document.getElementById('run').value").await, "r-3");
}

/// Wrap, times and the theme are the reader's: kept across a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrap_times_and_theme_survive_a_reload() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.prefs", "r-1", &format!("short\n{}end", "a long line ".repeat(60))).await;
    server.state("svc.prefs", "r-1", "running").await;
    let browser = Browser::start(1024, 700).await;
    let url = page(&server, "svc.prefs", "r-1");
    browser.goto(&url).await;
    browser.until("the long line", &line_in_view(1)).await;
    let tall = "const row = [...document.querySelectorAll('#log .ln')].find((l) => l.dataset.n === '2');
                return !!row && row.getBoundingClientRect().height > 40";
    assert_eq!(browser.js(tall).await, false, "one line per row unless wrapped");
    for button in ["wrap", "times", "theme"] {
        browser.js(&format!("document.getElementById('{button}').click(); return true")).await;
    }
    browser.until("the long line wrapped", tall).await;

    browser.goto(&url).await;
    browser.until("the page again", &line_in_view(1)).await;
    browser.until("still wrapped", tall).await;
    let clock = "const t = [...document.querySelectorAll('#log .ts')].map((s) => s.textContent);
                 return t.length === 2 && /^\\d\\d:\\d\\d:\\d\\d\\.\\d{3}$/.test(t[0])";
    browser.until("times on the clock", clock).await;
    let buttons = "return [document.getElementById('wrap').getAttribute('aria-pressed'),
                           document.getElementById('times').textContent, document.documentElement.dataset.theme]";
    let dark = if browser.js("return matchMedia('(prefers-color-scheme: dark)').matches").await == true {
        "light"
    } else {
        "dark"
    };
    assert_eq!(browser.js(buttons).await, serde_json::json!(["true", "Times: clock", dark]));
}

/// Consecutive lines that show the same (escape sequences removed, a
/// `\r`-redrawn line as its last state) are one row with `× N`; a group
/// shows how long it took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_lines_show_once_with_their_count_and_groups_their_duration() {
    let server = LogServer::start(quick_settings()).await;
    let lines = [
        "start",
        "\x1b[32mwaiting\x1b[0m",
        "waiting",
        "\x1b[1mwaiting\x1b[0m",
        "progress 5%\rwaiting",
        "done",
        "done!",
        "::group::Build",
        "compile",
        "::endgroup::",
    ];
    server.lines("svc.repeat", "r-1", &lines.join("\n")).await;
    server.state("svc.repeat", "r-1", "running").await;
    let browser = Browser::start(1280, 800).await;
    browser.goto(&page(&server, "svc.repeat", "r-1")).await;
    let shown = browser
        .until(
            "the repeats as one row and the group folded with its duration",
            "const t = [...document.querySelectorAll('#log .tx')].map((l) => l.textContent);
             return t.length === 5 && /\\d\\.\\ds$/.test(t[4]) && t",
        )
        .await;
    let shown: Vec<String> = serde_json::from_value(shown).unwrap();
    assert_eq!(shown[..4], ["start", "waiting× 4", "done", "done!"]);
    let took = regex::Regex::new(r"^Build1 lines\d+\.\ds$").unwrap();
    assert!(took.is_match(&shown[4]), "{shown:?}");
    let colour =
        "const s = document.querySelector('#log .ln[data-n=\"2\"] .tx span'); return getComputedStyle(s).color";
    assert_eq!(browser.js(colour).await, "rgb(29, 122, 58)", "the first of the repeats shows, green");
}

/// A failed run opens at its first error, selected and in view, with the
/// group it is in unfolded (the other finished groups folded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_opens_at_its_first_error_with_its_group_unfolded() {
    let server = LogServer::start(quick_settings()).await;
    let mut lines: Vec<String> = ["setup", "::group::Prepare", "p1", "::endgroup::", "::group::Build", "compiling"]
        .into_iter()
        .map(String::from)
        .collect();
    lines.extend(["error: the build broke".into(), "more".into(), "::endgroup::".into()]);
    lines.extend((1..=300).map(|i| format!("after {i}")));
    lines.push("error: a later one".into());
    server.lines("svc.failed", "r-1", &lines.join("\n")).await;
    server.state("svc.failed", "r-1", "failed").await;
    let browser = Browser::start(1280, 800).await;
    browser.goto(&page(&server, "svc.failed", "r-1")).await;
    let folded = "const rows = [...document.querySelectorAll('#log .ln.grp')];
                  const shut = (t) => rows.some((r) => r.querySelector('.tx').firstChild.textContent === t && r.classList.contains('shut'));
                  return rows.length === 2 && shut('Prepare') && !shut('Build')";
    browser.until("Prepare folded, Build open", folded).await;
    assert_eq!(browser.until("the first error", &line_in_view(7)).await, "error: the build broke");
    let selected = "return [...document.querySelectorAll('#log .ln.sel')].map((l) => l.dataset.n)";
    assert_eq!(browser.js(selected).await, serde_json::json!(["7"]));
}

/// Compare with last success: a failed run against the success before it
/// shows the lines it added, the first in view; a line number still links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_with_last_success_shows_the_added_error_lines() {
    let server = LogServer::start(quick_settings()).await;
    let common: Vec<String> = (1..=200).map(|i| format!("step {i} ok")).collect();
    server.lines("svc.cmp", "r-1", &common.join("\n")).await;
    server.state("svc.cmp", "r-1", "success").await;
    let mut failed = common.clone();
    failed.insert(150, "error: the disk is full".into());
    failed.insert(151, "error: giving up".into());
    server.lines("svc.cmp", "r-2", &failed.join("\n")).await;
    server.state("svc.cmp", "r-2", "failed").await;
    let browser = Browser::start(1280, 800).await;
    browser.goto(&page(&server, "svc.cmp", "r-2")).await;
    browser.until("the first error", &line_in_view(151)).await;
    browser.js("document.getElementById('compare').click(); return true").await;
    let added = "const rows = [...document.querySelectorAll('#diff .dl.add')];
                 return rows.length > 0 && rows.map((r) => r.querySelector('.tx').textContent)";
    let added = browser.until("the added lines", added).await;
    assert_eq!(added, serde_json::json!(["error: the disk is full", "error: giving up"]));
    let in_view = "const box = document.getElementById('diff').getBoundingClientRect();
                   const r = document.querySelector('#diff .dl.add').getBoundingClientRect();
                   return r.top >= box.top && r.bottom <= box.bottom";
    assert_eq!(browser.js(in_view).await, true, "the first divergence in view");
    browser.js("[...document.querySelectorAll('#diff .dl.add a.no')].find((a) => a.textContent === '152').click(); return true").await;
    assert_eq!(browser.until("line 152", &line_in_view(152)).await, "error: giving up");
    assert_eq!(browser.js("return location.hash").await, "#L152");
}
