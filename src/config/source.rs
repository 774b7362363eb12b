//! Maps a position in the TOML text to what a user needs to find it: a line
//! number and the dotted key path (`limits[2].refill_rate`).

use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(usize),
}

pub fn render_path(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                if k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                {
                    out.push_str(k);
                } else {
                    out.push_str(&format!("\"{k}\""));
                }
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// 1-based line of a byte offset.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The line where the value (or table) at `path` is written.
pub(super) fn line_of_path(text: &str, path: &[Segment]) -> Option<usize> {
    let root = DeTable::parse(text).ok()?;
    let mut span = root.span();
    let mut current: Option<&Spanned<DeValue>> = None;
    let mut table: Option<&DeTable> = Some(root.get_ref());
    for segment in path {
        let next = match (segment, table, current.map(|v| v.get_ref())) {
            (Segment::Key(k), Some(t), _) => t.get(k.as_str()),
            (Segment::Index(i), _, Some(DeValue::Array(a))) => a.get(*i),
            _ => None,
        };
        match next {
            Some(value) => {
                span = value.span();
                table = match value.get_ref() {
                    DeValue::Table(t) => Some(t),
                    _ => None,
                };
                current = Some(value);
            }
            None => break,
        }
    }
    Some(line_of(text, span.start))
}

/// The deepest key path whose key or value covers `at`.
pub(super) fn path_at(text: &str, at: Range<usize>) -> Vec<Segment> {
    let mut path = Vec::new();
    let Ok(root) = DeTable::parse(text) else {
        return path;
    };
    descend_table(root.get_ref(), &at, &mut path);
    path
}

fn covers(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end.max(outer.start + 1)
}

/// Tables written with a `[header]` do not span their keys, so every child is
/// searched rather than only those whose span covers the position.
fn descend_table(table: &DeTable, at: &Range<usize>, path: &mut Vec<Segment>) -> bool {
    for (key, value) in table.iter() {
        path.push(Segment::Key(key.get_ref().to_string()));
        if covers(&key.span(), at) || descend_value(value, at, path) {
            return true;
        }
        path.pop();
    }
    false
}

fn descend_value(value: &Spanned<DeValue>, at: &Range<usize>, path: &mut Vec<Segment>) -> bool {
    match value.get_ref() {
        DeValue::Table(t) => descend_table(t, at, path) || covers(&value.span(), at),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(Segment::Index(i));
                if descend_value(item, at, path) {
                    return true;
                }
                path.pop();
            }
            covers(&value.span(), at)
        }
        _ => covers(&value.span(), at),
    }
}
