//! The configuration reference (docs/book/configuration.md) against the
//! parser: every key a section's type accepts has its row, and every row
//! names a key that exists. The keys are read from the serde types
//! themselves, so a key added to `file.rs` without its row fails here.

use serde::de::{Error as _, Visitor};
use serde::Deserialize;

use crate::config::file::{
    AdminSection, BanSection, BlockSection, CertSection, ClientsSection, CostSection, CountSection,
    ExemptSection, FileConfig, JwtSection, LimitSection, LogSection, MatchSection, MemorySection,
    Numbers, ProtectionSection, RedisSection, ResponseCostSection, ResponseSection, RlsSection,
    SentinelSection, ServerSection, TlsSection, TracingSection, UpstreamSection,
};

const REFERENCE: &str = include_str!("../../../docs/book/configuration.md");

/// A deserializer that only listens: a derived `Deserialize` for a struct
/// hands it the struct's field names (as renamed) before anything else.
struct FieldNames<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> serde::Deserializer<'de> for FieldNames<'_> {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(Self::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(fields);
        Err(Self::Error::custom("fields read"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

fn keys_of<T: for<'de> Deserialize<'de>>() -> Vec<&'static str> {
    let mut fields = None;
    let _ = T::deserialize(FieldNames(&mut fields));
    let fields = fields.unwrap_or_else(|| panic!("{} is no struct", std::any::type_name::<T>()));
    fields.to_vec()
}

/// The section's heading is "## `[name]`"; its rows run to the next heading.
fn section(name: &str) -> &'static str {
    let heading = format!("## `{name}`\n");
    let start = REFERENCE
        .find(&heading)
        .unwrap_or_else(|| panic!("the reference has no section {name}"));
    let body = &REFERENCE[start + heading.len()..];
    &body[..body.find("\n## ").unwrap_or(body.len())]
}

/// Each table row's keys (the backquoted names of its first cell) with the
/// rest of the row. A nested table's row (`[clients.jwt]`,
/// `[limits.tiers.<tier>]`) names the key it is written under.
fn rows(section: &str) -> Vec<(Vec<String>, &str)> {
    section
        .lines()
        .filter_map(|line| {
            let cells = line.strip_prefix('|')?;
            let (first, rest) = cells.split_once('|')?;
            let keys: Vec<String> = first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|quoted| {
                    quoted
                        .trim_matches(|c| c == '[' || c == ']')
                        .split('.')
                        .rfind(|part| !part.starts_with('<'))
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect();
            (!keys.is_empty()).then_some((keys, rest))
        })
        .collect()
}

/// Checks one section both ways; `elsewhere` are keys of the type that are
/// documented as a section of their own.
fn documented_as_parsed(name: &str, keys: &[&str], elsewhere: &[&str]) -> Vec<String> {
    let documented: Vec<String> = rows(section(name))
        .into_iter()
        .flat_map(|(keys, _)| keys)
        .collect();
    let mut problems = Vec::new();
    for key in keys {
        if !elsewhere.contains(key) && !documented.iter().any(|d| d == key) {
            problems.push(format!("{name}: `{key}` is parsed but has no row"));
        }
    }
    for key in &documented {
        if !keys.contains(&key.as_str()) {
            problems.push(format!("{name}: `{key}` has a row but is not a key"));
        }
    }
    problems
}

/// The keys a row gives an inline table: the top-level keys of the first
/// `{ ... }` in it (`{ after, within, duration }`, `{ master = "name", ... }`),
/// or, for a row that lists them in prose, its backquoted names
/// (`[clients.jwt.tiers]` names `tiers`).
fn inline_keys(row: &str) -> Vec<String> {
    let Some(open) = row.find('{') else {
        return row
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|quoted| {
                // `name`, `name = value`, `[table.name]`.
                let name = quoted.split(['=', ' ']).next().unwrap_or("");
                let name = name.trim_matches(|c| c == '[' || c == ']');
                name.rsplit('.').next().unwrap_or(name).to_owned()
            })
            .filter(|name| {
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
            .collect();
    };
    table_keys(&row[open..]).0
}

/// The top-level keys of the inline table `text` opens with, and where
/// the table ends in it.
fn table_keys(text: &str) -> (Vec<String>, usize) {
    let (mut depth, mut quoted, mut entry) = (0, false, String::new());
    let mut end = text.len();
    let mut keys = Vec::new();
    let mut finish = |entry: &mut String| {
        let key = entry.split('=').next().unwrap_or("").trim().to_owned();
        if !key.is_empty() && key != "..." {
            keys.push(key);
        }
        entry.clear();
    };
    for (at, c) in text.char_indices().skip(1) {
        match c {
            '"' => quoted = !quoted,
            _ if quoted => {}
            '{' | '[' => depth += 1,
            ']' => depth -= 1,
            '}' if depth == 0 => {
                finish(&mut entry);
                end = at + 1;
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                finish(&mut entry);
                continue;
            }
            _ => {}
        }
        if depth == 0 && !quoted && c != '"' {
            entry.push(c);
        }
    }
    (keys, end)
}

/// The keys of every inline table a row shows (`match` has two forms:
/// an HTTP request's, and a rate limit service descriptor's).
fn every_inline_key(row: &str) -> Vec<String> {
    if !row.contains('{') {
        return inline_keys(row);
    }
    let mut keys = Vec::new();
    let mut rest = row;
    while let Some(open) = rest.find('{') {
        let (found, end) = table_keys(&rest[open..]);
        keys.extend(found);
        rest = &rest[open + end..];
    }
    keys
}

/// A key whose value is an inline table (`ban = { after, within,
/// duration }`): its row gives exactly the table's keys.
fn inline_keys_named(name: &str, key: &str, keys: &[&str]) -> Vec<String> {
    let rows = rows(section(name));
    let Some((_, row)) = rows
        .iter()
        .find(|(names, _)| names.iter().any(|n| n == key))
    else {
        return vec![format!("{name}: no row for `{key}`")];
    };
    let documented = every_inline_key(row);
    let missing = keys
        .iter()
        .filter(|inner| !documented.iter().any(|d| d == **inner))
        .map(|inner| format!("{name}: the row of `{key}` does not name `{inner}`"));
    let unknown = documented
        .iter()
        .filter(|d| !keys.contains(&d.as_str()))
        .map(|d| format!("{name}: the row of `{key}` names `{d}`, which `{key}` does not take"));
    missing.chain(unknown).collect()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a table of cases, one or two lines each"
)]
fn every_key_the_parser_takes_is_in_the_reference_and_no_other() {
    let mut problems = Vec::new();
    problems.extend(documented_as_parsed(
        "[server]",
        &keys_of::<ServerSection>(),
        &["tls"],
    ));
    problems.extend(documented_as_parsed(
        "[server.tls]",
        &keys_of::<TlsSection>(),
        &[],
    ));
    problems.extend(documented_as_parsed(
        "[upstream]",
        &keys_of::<UpstreamSection>(),
        &[],
    ));
    problems.extend(documented_as_parsed("[log]", &keys_of::<LogSection>(), &[]));
    problems.extend(documented_as_parsed(
        "[admin]",
        &keys_of::<AdminSection>(),
        &[],
    ));
    problems.extend(documented_as_parsed("[rls]", &keys_of::<RlsSection>(), &[]));
    problems.extend(documented_as_parsed(
        "[tracing]",
        &keys_of::<TracingSection>(),
        &[],
    ));
    problems.extend(documented_as_parsed(
        "[memory]",
        &keys_of::<MemorySection>(),
        &[],
    ));
    problems.extend(documented_as_parsed(
        "[redis]",
        &keys_of::<RedisSection>(),
        &[],
    ));
    problems.extend(documented_as_parsed(
        "[clients]",
        &keys_of::<ClientsSection>(),
        &[],
    ));
    problems.extend(documented_as_parsed(
        "[block]",
        &keys_of::<BlockSection>(),
        &[],
    ));
    problems.extend(documented_as_parsed(
        "[exempt]",
        &keys_of::<ExemptSection>(),
        &[],
    ));
    problems.extend(documented_as_parsed(
        "[[limits]]",
        &keys_of::<LimitSection>(),
        &[],
    ));
    problems.extend(documented_as_parsed(
        "[[costs]]",
        &keys_of::<CostSection>(),
        &[],
    ));
    problems.extend(documented_as_parsed(
        "[response]",
        &keys_of::<ResponseSection>(),
        &[],
    ));
    problems.extend(inline_keys_named(
        "[server.tls]",
        "certs",
        &keys_of::<CertSection>(),
    ));
    problems.extend(inline_keys_named(
        "[redis]",
        "sentinel",
        &keys_of::<SentinelSection>(),
    ));
    problems.extend(inline_keys_named(
        "[clients]",
        "jwt",
        &keys_of::<JwtSection>(),
    ));
    problems.extend(inline_keys_named(
        "[upstream]",
        "protection",
        &keys_of::<ProtectionSection>(),
    ));
    for (key, keys) in [
        ("match", keys_of::<MatchSection>()),
        ("count", keys_of::<CountSection>()),
        ("cost_from_response", keys_of::<ResponseCostSection>()),
        ("ban", keys_of::<BanSection>()),
    ] {
        problems.extend(inline_keys_named("[[limits]]", key, &keys));
    }
    // Every table of the file has its section, as a table or a list of them.
    for table in keys_of::<FileConfig>() {
        let plain = format!("## `[{table}]`\n");
        let list = format!("## `[[{table}]]`\n");
        if !REFERENCE.contains(&plain) && !REFERENCE.contains(&list) {
            problems.push(format!("[{table}] is parsed but has no section"));
        }
    }
    // A tier's overrides are a limit's own numbers, documented there.
    let limit_keys = keys_of::<LimitSection>();
    for number in keys_of::<Numbers>() {
        if !limit_keys.contains(&number) {
            problems.push(format!(
                "[limits.tiers.<tier>]: `{number}` is no key of a limit, so no row says it"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn an_inline_tables_keys_are_read_from_its_row() {
    assert_eq!(
        inline_keys(r#"`{ master = "name", nodes = ["a", ...], password_file = "..." }`: x"#),
        ["master", "nodes", "password_file"]
    );
    assert_eq!(
        inline_keys(r#"`{ paths = ["/a"], headers = { "X-A" = "b*" } }`; `*` matches"#),
        ["paths", "headers"]
    );
    assert_eq!(
        inline_keys("`header` (`\"Authorization\"`), `leeway` (`\"60s\"`), `[clients.jwt.tiers]`, `names = [\"a\"]`"),
        ["header", "leeway", "tiers", "names"]
    );
}

#[test]
fn the_reading_of_the_reference_sees_what_it_should() {
    // A check that reads nothing would pass: these are known rows.
    let limits = rows(section("[[limits]]"));
    assert!(limits.iter().any(|(keys, _)| keys == &["tiers"]));
    assert!(limits
        .iter()
        .any(|(keys, _)| keys == &["period", "timezone", "week_starts"]));
    assert_eq!(keys_of::<BanSection>(), ["after", "within", "duration"]);
    assert!(keys_of::<LimitSection>().contains(&"match"));
    let missing = documented_as_parsed("[block]", &["cidrs", "api_keys", "not_a_key"], &[]);
    assert_eq!(
        missing,
        [
            "[block]: `not_a_key` is parsed but has no row",
            "[block]: `jwt_subjects` has a row but is not a key",
            "[block]: `status` has a row but is not a key",
        ]
    );
}

/// The lines of `examples/full.toml` under `[name]` (or every `[[name]]`),
/// each table's own, not its sub-tables'.
fn example_section(example: &str, name: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in example.lines() {
        // A table's header, written or commented out (`# [server.tls]`).
        let bare = line.trim_start_matches(['#', ' ']);
        let header =
            bare.starts_with('[') && bare.find(']').is_some_and(|end| !bare[..end].contains('='));
        if header {
            let table = bare.split(']').next().unwrap_or("").trim_matches('[');
            inside = table == name.trim_matches(['[', ']']);
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Whether `key` is set (or shown, commented out, where it excludes
/// another) in `text`, on a line of its own or in an inline table.
fn example_sets(text: &str, key: &str) -> bool {
    text.lines().any(|line| {
        let line = line.trim_start_matches(['#', ' ']);
        let bare = line.starts_with(&format!("{key} =")) || line.starts_with(&format!("{key}="));
        let quoted = line.starts_with(&format!("\"{key}\" ="));
        let inline = line.contains(&format!("{{ {key} =")) || line.contains(&format!(", {key} ="));
        bare || quoted || inline
    })
}

#[test]
fn the_full_example_shows_every_key_the_parser_takes() {
    let example = include_str!("../../../examples/full.toml");
    let sections: Vec<(&str, Vec<&str>, &[&str])> = vec![
        ("[server]", keys_of::<ServerSection>(), &["tls"]),
        ("[server.tls]", keys_of::<TlsSection>(), &["certs"]),
        ("[[server.tls.certs]]", keys_of::<CertSection>(), &[]),
        ("[upstream]", keys_of::<UpstreamSection>(), &["protection"]),
        ("[upstream.protection]", keys_of::<ProtectionSection>(), &[]),
        ("[memory]", keys_of::<MemorySection>(), &[]),
        ("[redis]", keys_of::<RedisSection>(), &[]),
        (
            "[clients]",
            keys_of::<ClientsSection>(),
            &["jwt", "api_keys"],
        ),
        ("[clients.jwt]", keys_of::<JwtSection>(), &["tiers"]),
        ("[exempt]", keys_of::<ExemptSection>(), &[]),
        ("[block]", keys_of::<BlockSection>(), &[]),
        ("[[limits]]", keys_of::<LimitSection>(), &["tiers"]),
        ("[[costs]]", keys_of::<CostSection>(), &[]),
        ("[response]", keys_of::<ResponseSection>(), &[]),
        ("[log]", keys_of::<LogSection>(), &[]),
        ("[admin]", keys_of::<AdminSection>(), &[]),
        ("[rls]", keys_of::<RlsSection>(), &[]),
        ("[tracing]", keys_of::<TracingSection>(), &[]),
    ];
    let mut missing = Vec::new();
    for (name, keys, elsewhere) in &sections {
        let text = example_section(example, name);
        for key in keys.iter().filter(|k| !elsewhere.contains(k)) {
            if !example_sets(&text, key) {
                missing.push(format!("{name} {key}"));
            }
        }
    }
    let limits = example_section(example, "[[limits]]");
    for (table, keys) in [
        ("match", keys_of::<MatchSection>()),
        ("count", keys_of::<CountSection>()),
        ("cost_from_response", keys_of::<ResponseCostSection>()),
        ("ban", keys_of::<BanSection>()),
    ] {
        for key in keys {
            if !example_sets(&limits, key) {
                missing.push(format!("[[limits]] {table}.{key}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "examples/full.toml leaves out: {}",
        missing.join(", ")
    );
}
