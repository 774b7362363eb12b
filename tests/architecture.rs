//! What Cargo cannot check of the layering. Between crates, the manifests
//! hold it (floodgate-algorithm names no other crate of floodgate,
//! floodgate-limiter only the algorithms, floodgate-policy those two); within
//! each crate, these tests do: no two files depend on each other, directly or
//! round a loop, and the binary crate's rate-limit headers know nothing of
//! the config. A dependency is any path into the crate a file names
//! (`use crate::...`, `use super::...`, or a path written inline), resolved
//! to the file that defines the module it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every crate's sources, the binary's and each under crates/.
const CRATES: [&str; 4] = [
    concat!(env!("CARGO_MANIFEST_DIR"), "/src"),
    concat!(env!("CARGO_MANIFEST_DIR"), "/crates/algorithm/src"),
    concat!(env!("CARGO_MANIFEST_DIR"), "/crates/limiter/src"),
    concat!(env!("CARGO_MANIFEST_DIR"), "/crates/policy/src"),
];

/// Every source file of the crate at `src`, by its path under it
/// ("redis/mod.rs").
fn sources(src: &str) -> BTreeMap<String, String> {
    fn walk(src: &str, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("read src")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(src, &path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path
                    .strip_prefix(src)
                    .expect("under src")
                    .to_string_lossy()
                    .into_owned();
                let text = std::fs::read_to_string(&path).expect("read source");
                out.insert(name, text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, Path::new(src), &mut out);
    out
}

/// The module path of a file: "limiter/redis/mod.rs" -> ["limiter", "redis"].
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The file defining the longest module prefix of `path`.
fn file_of(path: &[String], files: &BTreeMap<String, String>) -> Option<String> {
    (1..=path.len()).rev().find_map(|n| {
        let stem = path[..n].join("/");
        [format!("{stem}.rs"), format!("{stem}/mod.rs")]
            .into_iter()
            .find(|f| files.contains_key(f))
    })
}

/// Code without comments and string literals, so that neither can name a
/// dependency.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut in_string = false;
        let mut escaped = false;
        for c in line.chars() {
            match (in_string, c) {
                (true, '\\') if !escaped => escaped = true,
                (true, '"') if !escaped => in_string = false,
                (true, _) => escaped = false,
                (false, '"') => in_string = true,
                (false, c) => out.push(c),
            }
        }
        out.push('\n');
    }
    out
}

/// Every path a file names into the crate, from `crate::` or `super::`,
/// with `use` groups (`a::{b, c::d}`) expanded.
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let rest: String = chars[i..chars.len().min(i + 7)].iter().collect();
        let starts = (rest.starts_with("crate::") || rest.starts_with("super::"))
            && (i == 0
                || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == ':'));
        if !starts {
            i += 1;
            continue;
        }
        // The whole path, braces included.
        let mut depth = 0;
        let mut j = i;
        while j < chars.len() {
            let c = chars[j];
            if c == '{' {
                depth += 1;
            } else if c == '}' {
                if depth == 0 {
                    break;
                }
                depth -= 1;
            } else if depth == 0 && !(c.is_alphanumeric() || c == '_' || c == ':') {
                break;
            }
            j += 1;
        }
        let text: String = chars[i..j].iter().filter(|c| !c.is_whitespace()).collect();
        for expanded in expand(&text) {
            let mut segments: Vec<String> = expanded.split("::").map(String::from).collect();
            let mut base: Vec<String> = Vec::new();
            match segments.first().map(String::as_str) {
                Some("crate") => {
                    segments.remove(0);
                }
                _ => {
                    base = module.to_vec();
                    while segments.first().map(String::as_str) == Some("super") {
                        segments.remove(0);
                        base.pop();
                    }
                }
            }
            base.extend(
                segments
                    .into_iter()
                    .filter(|s| s != "self" && !s.is_empty()),
            );
            paths.push(base);
        }
        i = j.max(i + 1);
    }
    paths
}

/// `a::{b, c::{d, e}}` -> `a::b`, `a::c::d`, `a::c::e`.
fn expand(path: &str) -> Vec<String> {
    let Some(open) = path.find('{') else {
        return vec![path.to_string()];
    };
    let prefix = &path[..open];
    let inner = &path[open + 1..path.rfind('}').unwrap_or(path.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

/// Paths `use` statements name relative to the file's own module
/// (`use child::Item;`, `pub use self::child::Item;`).
fn relative_uses(code: &str, module: &[String]) -> Vec<Vec<String>> {
    code.split(';')
        .filter_map(|statement| {
            let statement = statement.trim();
            let tree = statement
                .strip_prefix("use ")
                .or_else(|| statement.strip_prefix("pub use "))
                .or_else(|| statement.strip_prefix("pub(crate) use "))
                .or_else(|| statement.strip_prefix("pub(super) use "))?;
            let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
            let tree = tree.strip_prefix("self::").unwrap_or(&tree).to_string();
            (!tree.starts_with("crate::") && !tree.starts_with("super::")).then_some(tree)
        })
        .flat_map(|tree| expand(&tree))
        .map(|path| {
            let mut full = module.to_vec();
            full.extend(path.split("::").map(String::from));
            full
        })
        .collect()
}

/// file -> the other files of its crate it depends on.
fn dependencies(src: &str) -> BTreeMap<String, BTreeSet<String>> {
    let files = sources(src);
    files
        .iter()
        .map(|(file, text)| {
            let module = module_of(file);
            let code = code_only(text);
            let code = code.split("#[cfg(test)]").next().unwrap_or(&code);
            // A relative path that names no file of this crate is another
            // crate's (`use std::...`): it resolves to nothing below, or to
            // this file itself, and is dropped.
            let relative = relative_uses(code, &module)
                .into_iter()
                .filter(|path| path.len() > module.len() + 1 || !module.is_empty());
            let deps = named_paths(code, &module)
                .into_iter()
                .chain(relative)
                .collect::<Vec<_>>()
                .iter()
                .filter_map(|path| file_of(path, &files))
                .filter(|dep| dep != file)
                .collect();
            (file.clone(), deps)
        })
        .collect()
}

#[test]
fn no_two_files_depend_on_each_other_round_a_loop() {
    for src in CRATES {
        let deps = dependencies(src);
        assert!(deps.len() > 3, "{src} holds the crate's sources");
        let loops = loops(&deps);
        assert!(
            loops.is_empty(),
            "import loops in {src}:\n{}",
            loops.join("\n")
        );
    }
}

fn loops(deps: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    // Depth-first search for a back edge; report the loop it closes.
    fn visit(
        file: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        loops: &mut Vec<String>,
    ) {
        if let Some(at) = stack.iter().position(|f| f == file) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(file.to_string());
            loops.push(cycle.join(" -> "));
            return;
        }
        if !done.insert(file.to_string()) {
            return;
        }
        stack.push(file.to_string());
        for dep in deps.get(file).into_iter().flatten() {
            visit(dep, deps, stack, done, loops);
        }
        stack.pop();
    }
    let (mut done, mut loops) = (BTreeSet::new(), Vec::new());
    for file in deps.keys() {
        visit(file, deps, &mut Vec::new(), &mut done, &mut loops);
    }
    loops
}

#[test]
fn the_rate_limit_headers_know_nothing_of_the_config() {
    // proxy/headers.rs is what a client reads; it is given numbers, not settings,
    // so that a config change cannot silently change what a 429 says.
    let deps = dependencies(CRATES[0]);
    let headers = deps
        .get("proxy/headers.rs")
        .expect("proxy/headers.rs in the binary crate");
    assert!(
        !headers.is_empty(),
        "the checker sees proxy/headers.rs's own dependencies"
    );
    let on_config: Vec<&String> = headers
        .iter()
        .filter(|d| d.starts_with("config/"))
        .collect();
    assert!(
        on_config.is_empty(),
        "proxy/headers.rs depends on {on_config:?}"
    );
}

#[test]
fn the_checker_sees_what_a_file_names() {
    let module = vec![
        "limiter".to_string(),
        "redis".to_string(),
        "batch".to_string(),
    ];
    let code = code_only("use super::{Scripted, batch::X};\nuse crate::algorithm::{Decision, kind::{Kind}};\n// crate::config::Config\nlet s = \"crate::config\"; crate::limiter::fallback::f(super::super::check::C);");
    let named: Vec<String> = named_paths(&code, &module)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        named,
        vec![
            "limiter::redis::Scripted",
            "limiter::redis::batch::X",
            "algorithm::Decision",
            "algorithm::kind::Kind",
            "limiter::fallback::f",
            "limiter::check::C",
        ]
    );
}
