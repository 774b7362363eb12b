//! The book (docs/book) and the README hold together: every chapter is in
//! SUMMARY.md and every entry there is a chapter; every relative link and
//! image names a file that exists, and every `#anchor` a heading of the file
//! it points into (slugged as mdBook and the forges slug them). When `mdbook`
//! is installed, the book is also built with it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn book() -> PathBuf {
    Path::new(ROOT).join("docs/book")
}

/// Every Markdown file the links are read from: the chapters and the README.
fn pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(book())
        .expect("docs/book")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.push(Path::new(ROOT).join("README.md"));
    pages.sort();
    pages
}

/// The text outside fenced code blocks and inline code, where a link is a
/// link.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

/// Every inline link's and image's target: `[text](target)`, `![alt](target)`.
fn link_targets(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

/// A heading's anchor, as mdBook and GitHub spell it: lower case, spaces to
/// hyphens, every other character but letters, digits, `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// Every anchor a page's headings give, repeats numbered as both number them
/// (`name`, `name-1`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(heading) = line.strip_prefix('#').filter(|_| !fenced) else {
            continue;
        };
        let slug = slug(heading.trim_start_matches('#'));
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

fn broken_links(page: &Path, text: &str) -> Vec<String> {
    let dir = page.parent().expect("a page's folder");
    let name = page
        .strip_prefix(ROOT)
        .unwrap_or(page)
        .display()
        .to_string();
    let mut broken = Vec::new();
    for target in link_targets(text) {
        if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (target.as_str(), None),
        };
        let path = if file.is_empty() {
            page.to_path_buf()
        } else {
            dir.join(file)
        };
        if !path.exists() {
            broken.push(format!("{name}: {target}: no such file"));
            continue;
        }
        if let Some(anchor) = anchor {
            let linked = std::fs::read_to_string(&path).unwrap_or_default();
            if !anchors(&linked).contains(anchor) {
                broken.push(format!("{name}: {target}: no such heading"));
            }
        }
    }
    broken
}

#[test]
fn every_link_and_image_in_the_book_and_readme_resolves() {
    let mut broken = Vec::new();
    let mut links = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read page");
        links += link_targets(&text).len();
        broken.extend(broken_links(&page, &text));
    }
    assert!(links > 40, "the links were read ({links})");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The repository paths a page names in its text, code and code blocks
/// included (`crates/limiter/lua/slots.lua`, the code map's tree): what a
/// move of files leaves stale.
fn repository_paths(text: &str) -> Vec<String> {
    const TOP: [&str; 8] = [
        "src/",
        "crates/",
        "tests/",
        "scripts/",
        "docs/",
        "examples/",
        "benches/",
        "lua/",
    ];
    let in_path = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(|c: char| c.is_ascii_alphanumeric()) {
        let start = &rest[at..];
        let token: String = start.chars().take_while(|&c| in_path(c)).collect();
        let preceded = rest[..at].chars().last().is_some_and(in_path);
        if !preceded && TOP.iter().any(|top| token.starts_with(top)) {
            paths.push(token.trim_end_matches(['.', '-']).to_string());
        }
        rest = &start[token.len().max(1)..];
    }
    paths
}

#[test]
fn every_repository_path_the_book_names_exists() {
    let mut stale = Vec::new();
    let mut named = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read page");
        for path in repository_paths(&text) {
            named += 1;
            if !Path::new(ROOT).join(&path).exists() {
                let name = page
                    .strip_prefix(ROOT)
                    .unwrap_or(&page)
                    .display()
                    .to_string();
                stale.push(format!("{name}: {path}"));
            }
        }
    }
    assert!(named > 40, "the paths were read ({named})");
    assert!(
        stale.is_empty(),
        "paths that do not exist:\n{}",
        stale.join("\n")
    );
    assert_eq!(
        repository_paths("`lua/slots.lua` in crates/limiter/lua/, see src/main.rs. xsrc/a"),
        ["lua/slots.lua", "crates/limiter/lua/", "src/main.rs"]
    );
}

#[test]
fn the_summary_lists_every_chapter_and_only_chapters() {
    let summary = std::fs::read_to_string(book().join("SUMMARY.md")).expect("SUMMARY.md");
    let listed: BTreeSet<String> = link_targets(&summary).into_iter().collect();
    let chapters: BTreeSet<String> = pages()
        .iter()
        .filter(|p| p.starts_with(book()))
        .filter_map(|p| p.file_name()?.to_str().map(String::from))
        .filter(|n| n != "SUMMARY.md")
        .collect();
    assert!(chapters.len() > 5, "the chapters were found");
    assert_eq!(listed, chapters, "SUMMARY.md against docs/book/*.md");
}

#[test]
fn the_checker_finds_what_is_broken() {
    let page = book().join("redis.md");
    let text = "[ok](configuration.md#redis) [gone](nowhere.md) [no heading](configuration.md#nowhere) \
                `[in code](nowhere.md)` ![img](images/status-page.png) [web](https://example.com/x)";
    assert_eq!(
        broken_links(&page, text),
        vec![
            "docs/book/redis.md: nowhere.md: no such file",
            "docs/book/redis.md: configuration.md#nowhere: no such heading",
        ]
    );
    assert_eq!(slug(" `[[limits]]` "), "limits");
    assert_eq!(
        slug("Headers the upstream trusts"),
        "headers-the-upstream-trusts"
    );
    let repeated = anchors("# Tiers\n## Tiers\n```\n# not a heading\n```\n");
    assert_eq!(
        repeated,
        BTreeSet::from(["tiers".to_string(), "tiers-1".to_string()])
    );
}

#[test]
fn mdbook_builds_the_book_when_it_is_installed() {
    let Ok(version) = Command::new("mdbook").arg("--version").output() else {
        // Not installed: the links above are what is checked.
        return;
    };
    assert!(version.status.success(), "mdbook --version");
    let out = std::env::temp_dir().join(format!("floodgate-book-{}", std::process::id()));
    let built = Command::new("mdbook")
        .arg("build")
        .arg(book())
        .arg("--dest-dir")
        .arg(&out)
        .output()
        .expect("run mdbook");
    let rendered = out.join("algorithms.html").exists();
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        built.status.success(),
        "mdbook build failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    assert!(rendered, "mdbook rendered the chapters");
}
