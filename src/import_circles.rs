//! A check that the crate's modules import each other without circles.
//!
//! Reads every `src/**/*.rs`, collects each module's paths into the crate
//! (`use crate::a::b`, `use super::x`, a `use` of a child module, and paths
//! such as `crate::slots::Released` in code), resolves each to the deepest
//! module file it names, and asserts the graph has no strongly connected
//! component of two or more modules. An arrow between a module and its own
//! ancestor or descendant is not counted: a parent declares its children,
//! and a child may use what its parent holds. Test modules are left out.
//!
//! A module that two others need goes below both (STYLE.md); this keeps it
//! so.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module's path below the crate root (`["front", "buffers"]`; the root
/// is `[]`).
type Module = Vec<String>;

/// Circles known and being broken elsewhere: each entry is a circle's
/// modules, sorted. None is left: a new one fails the test.
const KNOWN: &[&[&str]] = &[];

/// The module a file under `src/` defines.
fn module_of(relative: &Path) -> Module {
    let mut parts: Module = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs").to_string();
        if stem != "mod" && stem != "lib" && stem != "main" {
            parts.push(stem);
        }
    }
    parts
}

/// `text` without comments, string and char literals (their contents could
/// look like paths).
fn strip(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            i += 2;
        } else if c == 'r' && (next == Some('#') || next == Some('"')) && is_raw_start(&chars, i) {
            let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
            i += 2 + hashes;
            while i < chars.len() {
                if chars[i] == '"' && chars[i + 1..].iter().take(hashes).all(|&h| h == '#') {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && next == Some('\\') {
            // An escaped char literal: '\n', '\'', '\u{..}'.
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether the `r` at `i` starts a raw string (not the end of an ident).
fn is_raw_start(chars: &[char], i: usize) -> bool {
    let after_ident = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
    !after_ident && chars.get(i + 1 + hashes) == Some(&'"')
}

/// `code` without `#[cfg(test)] mod NAME { ... }` blocks.
fn without_test_modules(code: &str) -> String {
    let mut out = code.to_string();
    while let Some(start) = out.find("#[cfg(test)]") {
        let rest = &out[start..];
        let Some(open) = rest.find('{') else { break };
        let head = &rest[..open];
        let is_module = head.split_whitespace().any(|w| w == "mod");
        let semicolon = head.contains(';');
        if !is_module || semicolon {
            // Some other test-only item: leave it, keep scanning after it.
            let cut = start + "#[cfg(test)]".len();
            out.replace_range(start..cut, "");
            continue;
        }
        let mut depth = 0usize;
        let mut end = out.len();
        for (offset, c) in out[start + open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = start + open + offset + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.replace_range(start..end, "");
    }
    out
}

/// The paths of a `use` tree (`a::{b, c::{d as e}}` is `a::b`, `a::c::d`).
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    fn split_top(list: &str) -> Vec<&str> {
        let (mut parts, mut depth, mut from) = (Vec::new(), 0usize, 0usize);
        for (i, c) in list.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    parts.push(&list[from..i]);
                    from = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&list[from..]);
        parts
    }
    fn segments(path: &str) -> Vec<String> {
        let path = path.split(" as ").next().unwrap_or(path);
        path.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }
    fn walk(prefix: &[String], list: &str, out: &mut Vec<Vec<String>>) {
        for part in split_top(list) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            match (part.find('{'), part.rfind('}')) {
                (Some(open), Some(close)) => {
                    let mut head = prefix.to_vec();
                    head.extend(segments(&part[..open]));
                    walk(&head, &part[open + 1..close], out);
                }
                _ => {
                    let mut path = prefix.to_vec();
                    path.extend(segments(part));
                    out.push(path);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &[],
        &tree.split_whitespace().collect::<Vec<_>>().join(" "),
        &mut out,
    );
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every path in `code` that could name a module of the crate.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = String::new();
    // `use` statements, as trees.
    let mut i = 0;
    let bytes: Vec<char> = code.chars().collect();
    while i < bytes.len() {
        let at_word = i == 0 || !is_ident_char(bytes[i - 1]);
        let is_use = at_word
            && bytes[i..].starts_with(&['u', 's', 'e'])
            && bytes.get(i + 3).is_some_and(|c| c.is_whitespace());
        if is_use {
            let end = bytes[i..]
                .iter()
                .position(|&c| c == ';')
                .map_or(bytes.len(), |p| i + p);
            let tree: String = bytes[i + 3..end].iter().collect();
            paths.extend(expand_use(&tree));
            i = end + 1;
        } else {
            rest.push(bytes[i]);
            i += 1;
        }
    }
    // Paths in code: `crate::a::b`, `super::x`, `self::y` (not the
    // `pub(in crate::x)` of a visibility).
    let chars: Vec<char> = rest.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let at_word = i == 0 || !is_ident_char(chars[i - 1]);
        let word: String = chars[i..]
            .iter()
            .take_while(|&&c| is_ident_char(c))
            .collect();
        if word.is_empty() {
            i += 1;
            continue;
        }
        let after = i + word.chars().count();
        let visibility: String = chars[..i].iter().rev().take(3).collect();
        if at_word
            && matches!(word.as_str(), "crate" | "super" | "self")
            && chars[after..].starts_with(&[':', ':'])
            && visibility != " ni"
        {
            let mut path = vec![word];
            let mut j = after;
            while chars[j..].starts_with(&[':', ':']) {
                let segment: String = chars[j + 2..]
                    .iter()
                    .take_while(|&&c| is_ident_char(c))
                    .collect();
                if segment.is_empty() {
                    break;
                }
                j += 2 + segment.chars().count();
                path.push(segment);
            }
            paths.push(path);
            i = j;
        } else {
            i = after;
        }
    }
    paths
}

/// The deepest module of `modules` that `path`, written in `from`, names.
fn resolve(from: &Module, path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    let first = path.first()?;
    let (mut base, rest): (Module, &[String]) = match first.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (from.clone(), &path[1..]),
        "super" => {
            let mut base = from.clone();
            let ups = path.iter().take_while(|s| *s == "super").count();
            for _ in 0..ups {
                base.pop();
            }
            (base, &path[ups..])
        }
        child => {
            let mut candidate = from.clone();
            candidate.push(child.to_string());
            if !modules.contains(&candidate) {
                return None;
            }
            (from.clone(), path)
        }
    };
    for segment in rest {
        base.push(segment.clone());
        if !modules.contains(&base) {
            base.pop();
            break;
        }
    }
    Some(base)
}

/// The import arrows between modules, from their sources: all of them, and
/// those that count (neither end an ancestor of the other).
fn arrows(sources: &BTreeMap<Module, String>) -> BTreeSet<(Module, Module)> {
    let modules: BTreeSet<Module> = sources.keys().cloned().collect();
    let mut arrows = BTreeSet::new();
    for (module, source) in sources {
        let code = without_test_modules(&strip(source));
        for path in paths_in(&code) {
            let Some(target) = resolve(module, &path, &modules) else {
                continue;
            };
            let related = target.starts_with(module) || module.starts_with(&target);
            if !related {
                arrows.insert((module.clone(), target));
            }
        }
    }
    arrows
}

/// The graph's circles: its strongly connected components of two or more
/// modules, each as its sorted `a::b` names.
fn circles(arrows: &BTreeSet<(Module, Module)>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&Module, Vec<&Module>> = BTreeMap::new();
    for (from, to) in arrows {
        next.entry(from).or_default().push(to);
        next.entry(to).or_default();
    }
    let reach = |start: &Module| -> BTreeSet<Module> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start.clone()];
        while let Some(m) = stack.pop() {
            for n in next.get(&m).into_iter().flatten() {
                if seen.insert((*n).clone()) {
                    stack.push((*n).clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&Module, BTreeSet<Module>> =
        next.keys().map(|m| (*m, reach(m))).collect();
    let mut found: BTreeSet<Vec<String>> = BTreeSet::new();
    for (module, reached) in &reachable {
        let mut circle: Vec<String> = reached
            .iter()
            .filter(|other| {
                reachable
                    .get(other)
                    .is_some_and(|back| back.contains(*module))
            })
            .map(|m| m.join("::"))
            .collect();
        if circle.len() >= 2 {
            circle.sort();
            found.insert(circle);
        }
    }
    found.into_iter().collect()
}

/// Every `.rs` file under `dir`, by its module.
fn read_sources(root: &Path, dir: &Path, out: &mut BTreeMap<Module, String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
        if path.is_dir() {
            read_sources(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).unwrap_or(&path);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.insert(module_of(relative), text);
        }
    }
}

fn module(name: &str) -> Module {
    name.split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_crates_modules_import_each_other_without_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = BTreeMap::new();
    read_sources(&root, &root, &mut sources);
    assert!(
        sources.len() > 40,
        "read the crate: {} files",
        sources.len()
    );
    let arrows = arrows(&sources);
    assert!(
        arrows.contains(&(module("front::fds"), module("front::awaiting"))),
        "the checker sees a sibling's `super::` import"
    );
    let unexpected: Vec<Vec<String>> = circles(&arrows)
        .into_iter()
        .filter(|circle| !KNOWN.iter().any(|known| known == circle))
        .collect();
    assert!(
        unexpected.is_empty(),
        "import circles (move what both need into a module below both): {unexpected:?}"
    );
}

#[test]
fn the_checker_finds_a_circle_and_leaves_a_parent_and_its_child_alone() {
    let sources: BTreeMap<Module, String> = [
        ("", "mod a; mod b; mod c;"),
        (
            "a",
            "mod inner; use crate::b::Thing; // use crate::c::X;\nfn f() { inner::g(); }",
        ),
        ("a::inner", "use super::Parent; use super::super::c::Y;"),
        (
            "b",
            "pub fn f() { let _ = \"crate::c::Z\"; crate::a::inner::g() }",
        ),
        (
            "c",
            "pub(in crate::a) struct Y;\n#[cfg(test)]\nmod tests { use crate::a::X; }",
        ),
    ]
    .into_iter()
    .map(|(m, s)| (module(m), s.to_string()))
    .collect();
    let arrows = arrows(&sources);
    let expected: BTreeSet<(Module, Module)> = [("a", "b"), ("a::inner", "c"), ("b", "a::inner")]
        .into_iter()
        .map(|(from, to)| (module(from), module(to)))
        .collect();
    assert_eq!(arrows, expected);
    assert_eq!(
        circles(&arrows),
        Vec::<Vec<String>>::new(),
        "a -> b -> a::inner is no circle: a::inner is a's own"
    );
    let mut with_circle = arrows.clone();
    with_circle.insert((module("c"), module("b")));
    assert_eq!(
        circles(&with_circle),
        vec![vec![
            "a::inner".to_string(),
            "b".to_string(),
            "c".to_string()
        ]]
    );
}
