//! The documentation's doors hold: README.md stays a short door, every page
//! of `docs/` is on its map, and every relative link in README.md,
//! BENCHMARKS.md, CHANGELOG.md and `docs/*.md` reaches a file that exists
//! and, when it names a `#section`, a heading of that file (GitHub's slugs).
//!
//! What the pages say is checked where the code lives: the verifier's
//! `sub_reason` list in `tests/verifier/classes.rs`, the documented
//! `docker run` line in `tests/ops.rs`, the grpcurl walkthrough's flags in
//! `tests/daemon/grpcurl.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// README.md is a door: what ptxd is, the set-up, a tour and a map.
const README_MAX_LINES: usize = 300;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `docs/*.md`, sorted.
fn doc_pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    pages
}

/// The Markdown files whose links are checked.
fn checked_files() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut files = vec![
        root.join("README.md"),
        root.join("BENCHMARKS.md"),
        root.join("CHANGELOG.md"),
    ];
    files.extend(doc_pages());
    files
}

/// The lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// `line` without its inline code spans (a link inside backticks is text).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    for (index, part) in line.split('`').enumerate() {
        if index % 2 == 0 {
            out.push_str(part);
        }
    }
    out
}

/// GitHub's anchor for a heading: links reduced to their text, lower case,
/// everything but letters, digits, `_`, `-` and spaces dropped, spaces to
/// `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match (after.find("]("), after.find(')')) {
            (Some(close), Some(end)) if close < end => {
                text.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            _ => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '_' || *c == '-' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor a Markdown file's headings make (a repeated one gets `-1`,
/// `-2`, ... as on GitHub).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes + 1..]);
        let repeats = seen.iter().filter(|s| **s == base).count();
        anchors.insert(if repeats == 0 {
            base.clone()
        } else {
            format!("{base}-{repeats}")
        });
        seen.push(base);
    }
    anchors
}

/// Every `](target)` link target of a line, in order.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(start) = rest.find("](") {
        let after = &rest[start + 2..];
        let Some(end) = after.find(')') else { break };
        let target = &after[..end];
        if !target.is_empty() && !target.contains(char::is_whitespace) {
            targets.push(target.to_string());
        }
        rest = &after[end + 1..];
    }
    targets
}

/// The broken links of one file: `file:line: target (why)`.
fn broken_links(file: &Path) -> Vec<String> {
    let text = read(file);
    let own_anchors = anchors(&text);
    let mut broken = Vec::new();
    for (number, line) in prose_lines(&text) {
        for target in link_targets(line) {
            let scheme = target
                .split_once(':')
                .is_some_and(|(s, _)| s.chars().all(|c| c.is_ascii_alphabetic()));
            if scheme {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let where_ = format!("{}:{number}: {target}", file.display());
            let target_file = if path.is_empty() {
                file.to_path_buf()
            } else {
                file.parent().unwrap().join(path)
            };
            if !target_file.exists() {
                broken.push(format!("{where_} (no such file)"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let known = if path.is_empty() {
                own_anchors.contains(anchor)
            } else if target_file.extension().is_some_and(|e| e == "md") {
                anchors(&read(&target_file)).contains(anchor)
            } else {
                true // a line anchor into source: GitHub's, not a heading
            };
            if !known {
                broken.push(format!("{where_} (no such heading)"));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let broken: Vec<String> = checked_files()
        .iter()
        .flat_map(|f| broken_links(f))
        .collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_door_with_a_map_of_every_docs_page() {
    let readme = read(&Path::new(ROOT).join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; move detail into docs/ (at most {README_MAX_LINES})"
    );
    let pages = doc_pages();
    assert!(!pages.is_empty(), "docs/ has no pages");
    for page in pages {
        let name = page.file_name().unwrap().to_string_lossy();
        assert!(
            readme.contains(&format!("](docs/{name})")),
            "README.md's map does not link docs/{name}"
        );
    }
    // The two set-up commands CI and the tests rely on.
    for command in [
        "cargo run --release -- serve --socket /tmp/ptxd.sock",
        "bash tests/run.sh",
    ] {
        assert!(
            readme.contains(command),
            "README.md lacks the command {command}"
        );
    }
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("The SDK (`ptxd-client`)"), "the-sdk-ptxd-client");
    assert_eq!(
        slug("Checking a node: `ptxd bench`"),
        "checking-a-node-ptxd-bench"
    );
    assert_eq!(slug("The gRPC API (`ptxd.v1`)"), "the-grpc-api-ptxdv1");
    assert_eq!(
        slug("Verification cost: bounded per uid, refusals remembered"),
        "verification-cost-bounded-per-uid-refusals-remembered"
    );
    let text = "# A\n## A\n```\n# not a heading\n```\n### b_c\n";
    let found: Vec<String> = anchors(text).into_iter().collect();
    assert_eq!(found, vec!["a", "a-1", "b_c"]);
    assert_eq!(
        link_targets("see [x](docs/a.md#b) and `[y](no)` and [z](#c)"),
        vec!["docs/a.md#b", "#c"]
    );
}
