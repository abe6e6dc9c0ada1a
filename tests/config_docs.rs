//! Every value the docs show for a setting parses: the values
//! `docs/configuration.md` lists for a string setting (written `` `"x"` ``),
//! and in `cluster-config/defaults.toml` every setting's value, the ones its
//! commented lines show, and the alternatives its comments quote. A user
//! who copies one gets a node that starts (the Kafka SASL names were once
//! documented in a spelling the code refused).

use tailrace::config::Config;

/// What a value needs beside it to load (the other key a rule asks for).
fn context(key: &str, value: &str) -> &'static str {
    match (key, value) {
        ("balancer.kind", "\"ring\"") => "virtual_nodes = 64\n",
        _ => "",
    }
}

/// `key = value` alone in its section, loaded as a config file.
fn loads(key: &str, value: &str) -> Result<(), String> {
    let (section, name) = key.rsplit_once('.').ok_or_else(|| format!("`{key}` has no section"))?;
    let text = format!("[{section}]\n{name} = {value}\n{}", context(key, value));
    Config::from_toml(&text, "a documented value").map(|_| ()).map_err(|e| format!("{key} = {value}: {e}"))
}

/// The quoted strings of `text` (`"a"`, `"b-c"`) that are plain words:
/// enumerated values, not paths or placeholders.
fn quoted_words(text: &str) -> Vec<String> {
    let parts: Vec<&str> = text.split('"').collect();
    parts
        .iter()
        .skip(1)
        .step_by(2)
        .take(parts.len() / 2)
        .filter(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        .map(|w| format!("\"{w}\""))
        .collect()
}

/// `(key, value)` of every value `docs/configuration.md` lists in
/// backticks and quotes for a string setting of its tables.
fn documented() -> Vec<(String, String)> {
    let text = std::fs::read_to_string("docs/configuration.md").unwrap();
    let mut values = Vec::new();
    for row in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        if cells.len() < 4 || cells[1] != "string" {
            continue;
        }
        let key = cells[0].trim_start_matches("| ").trim_matches('`');
        for shown in cells[2..4].iter().flat_map(|cell| cell.split("`\"").skip(1)) {
            if let Some((value, _)) = shown.split_once("\"`")
                && !value.contains('<')
                && !value.contains('…')
            {
                values.push((key.to_string(), format!("\"{value}\"")));
            }
        }
    }
    values
}

/// `defaults.toml` with every line it shows commented out set (a
/// commented section header included, and Kafka's mapped records, which
/// its mapping lines are for), and each line's alternatives: what its
/// comment quotes as other values, with the line number to put them on.
fn shown_in_defaults() -> (Vec<String>, Vec<(usize, String, String)>) {
    let text = std::fs::read_to_string("cluster-config/defaults.toml").unwrap();
    let mut section = String::new();
    let (mut lines, mut alternatives) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let shown = line.strip_prefix("# ").unwrap_or(line);
        if let Some(name) = shown.strip_prefix('[') {
            let (name, rest) = name.split_once(']').unwrap_or((name, ""));
            section = name.to_string();
            let header_only = rest.trim().is_empty() || rest.trim_start().starts_with('#');
            lines.push(if header_only { shown.to_string() } else { line.to_string() });
            continue;
        }
        let Some((name, rest)) = shown.split_once(" = ") else {
            lines.push(line.to_string());
            continue;
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c == '_') || rest.contains('…') {
            lines.push(line.to_string());
            continue;
        }
        let (value, comment) = rest.split_once("  #").unwrap_or((rest, ""));
        // The file as it is loads (`tests/config_files.rs`): what it sets is
        // no alternative here.
        let original = format!("{name} = {}", value.trim());
        let value = if section == "adapters.kafka" && name == "records" { "\"mapped\"" } else { value.trim() };
        lines.push(format!("{name} = {value}"));
        if value.starts_with('"') {
            // Not another key's value in the same comment (`or cookie_file = "path"`).
            let parts: Vec<&str> = comment.split(" = ").collect();
            let last = parts.len() - 1;
            let others: String = parts
                .iter()
                .enumerate()
                .map(|(i, part)| {
                    let part = if i > 0 { part.split_once(' ').map_or("", |p| p.1) } else { part };
                    if i < last { part.rsplit_once(' ').map_or("", |p| p.0) } else { part }
                })
                .collect::<Vec<_>>()
                .join(" ");
            for alternative in quoted_words(&others).into_iter().filter(|a| format!("{name} = {a}") != original) {
                alternatives.push((lines.len() - 1, format!("{section}.{name}"), format!("{name} = {alternative}")));
            }
        }
    }
    (lines, alternatives)
}

/// `lines` as a config file, with line `at` replaced by `setting` (and what
/// that value needs beside it).
fn load_with(lines: &[String], at: usize, key: &str, setting: &str) -> Result<(), String> {
    let mut text = lines.to_vec();
    let value = setting.split_once(" = ").map_or("", |(_, v)| v);
    text[at] = format!("{setting}\n{}", context(key, value));
    Config::from_toml(&text.join("\n"), "defaults.toml").map(|_| ()).map_err(|e| format!("{key}: {setting}: {e}"))
}

#[test]
fn every_value_the_configuration_reference_lists_parses() {
    let values = documented();
    assert!(values.iter().any(|(k, v)| k == "adapters.redis.trim" && v == "\"never\""), "{values:?}");
    let refused: Vec<String> = values.iter().filter_map(|(key, value)| loads(key, value).err()).collect();
    assert!(refused.is_empty(), "documented values that do not load:\n{}", refused.join("\n"));
}

#[test]
fn every_value_defaults_toml_shows_parses() {
    let (lines, alternatives) = shown_in_defaults();
    let whole = lines.join("\n");
    Config::from_toml(&whole, "defaults.toml with its commented lines set").unwrap_or_else(|e| panic!("{e}"));
    for (key, setting) in
        [("adapters.kafka.sasl_mechanism", "sasl_mechanism = \"scram-sha-256\""), ("balancer.kind", "kind = \"ring\"")]
    {
        assert!(
            alternatives.iter().any(|(_, k, s)| k == key && s == setting),
            "{setting} is not among {alternatives:?}"
        );
    }
    let refused: Vec<String> =
        alternatives.iter().filter_map(|(at, key, setting)| load_with(&lines, *at, key, setting).err()).collect();
    assert!(refused.is_empty(), "values defaults.toml shows that do not load:\n{}", refused.join("\n"));
}
