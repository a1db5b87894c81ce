//! The metric names a PromQL expression reads, for checking a dashboard's
//! and an alert file's queries against a real exposition.
//!
//! A small lexer, not a parser: it drops string literals, the insides of
//! label matchers (`{...}`), range and subquery brackets (`[...]`), numbers
//! and durations (`5m`, `0.9`, `1e3`), Grafana variables (`$instance`,
//! `${x}`, `$__rate_interval`), the label lists after `by`, `without`, `on`,
//! `ignoring`, `group_left` and `group_right`, keywords and operators, and
//! every identifier followed by `(` (a function or an aggregation) or an
//! aggregation followed by `by`/`without`. What is
//! left is the metric names. Grafana's `label_values(metric, label)` reads
//! `metric` only.

#![allow(dead_code)]

use std::collections::BTreeSet;

/// Words that are PromQL keywords, never metric names (outside `{}`).
const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
];

/// Aggregation operators: they may take `by (...)` or `without (...)`
/// before their parenthesised argument.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn identifier_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Skips from `chars[i]` (an opening `open`) to just past its matching
/// `close`, stepping over string literals. Errors when unbalanced.
fn skip_group(chars: &[char], mut i: usize, open: char, close: char) -> Result<usize, String> {
    let mut depth = 0usize;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => i = skip_string(chars, i)?,
            c if c == open => {
                depth += 1;
                i += 1;
            }
            c if c == close => {
                depth -= 1;
                i += 1;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => i += 1,
        }
    }
    Err(format!("unbalanced {open}{close}"))
}

/// Skips a string literal starting at `chars[i]`; returns the index past it.
fn skip_string(chars: &[char], i: usize) -> Result<usize, String> {
    let quote = chars[i];
    let mut j = i + 1;
    while j < chars.len() {
        match chars[j] {
            '\\' if quote != '`' => j += 2,
            c if c == quote => return Ok(j + 1),
            _ => j += 1,
        }
    }
    Err("unterminated string".to_owned())
}

/// The metric names `expr` reads.
pub fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let mut label_list_next = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i)?;
        } else if c == '{' {
            i = skip_group(&chars, i, '{', '}')?;
        } else if c == '[' {
            i = skip_group(&chars, i, '[', ']')?;
        } else if c == '(' && label_list_next {
            label_list_next = false;
            i = skip_group(&chars, i, '(', ')')?;
        } else if c == '#' {
            // A comment runs to the end of the line.
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                i = skip_group(&chars, i, '{', '}')?;
            } else {
                while i < chars.len() && identifier_char(chars[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // A number or a duration: digits, dots, exponents, unit letters.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if identifier_start(c) {
            let start = i;
            while i < chars.len() && identifier_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let lower = word.to_ascii_lowercase();
            if LABEL_LIST_KEYWORDS.contains(&lower.as_str()) {
                label_list_next = true;
                continue;
            }
            label_list_next = false;
            if chars.get(next) == Some(&'(') {
                if word == "label_values" {
                    // Grafana: label_values(metric, label) or label_values(label).
                    let end = skip_group(&chars, next, '(', ')')?;
                    let inner: String = chars[next + 1..end - 1].iter().collect();
                    if let Some((metric, _label)) = inner.split_once(',') {
                        names.extend(metric_names(metric)?);
                    }
                    i = end;
                }
                continue; // a function or an aggregation
            }
            let rest: String = chars[next..].iter().take(8).collect();
            let modifier_next = rest.starts_with("by") || rest.starts_with("without");
            if AGGREGATIONS.contains(&lower.as_str()) && modifier_next {
                continue; // `sum by (le) (...)`
            }
            if !KEYWORDS.contains(&lower.as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    Ok(names)
}

#[cfg(test)]
mod self_tests {
    use super::metric_names;

    fn names(expr: &str) -> Vec<String> {
        metric_names(expr).unwrap().into_iter().collect()
    }

    #[test]
    fn only_metric_names_are_left() {
        assert_eq!(
            names(
                r#"histogram_quantile(0.99, sum by (le, mode) (rate(a_bucket{mode="x}y",instance=~"$instance"}[$__rate_interval])))"#
            ),
            ["a_bucket"]
        );
        assert_eq!(
            names(
                "sum without (device) (rate(b_total[5m] offset 1h)) > bool 5 * on (instance) group_left (reason) c / ignoring (le) d unless e and 1e3 or .5"
            ),
            ["b_total", "c", "d", "e"]
        );
        assert_eq!(names("absent(f) # a comment naming g\n"), ["f"]);
        assert_eq!(
            names("label_values(ptxd_sessions, instance)"),
            ["ptxd_sessions"]
        );
        assert_eq!(names("label_values(instance)"), Vec::<String>::new());
        assert_eq!(names("x:recorded:rate5m > Inf"), ["x:recorded:rate5m"]);
        assert!(metric_names("rate(a[5m]").is_ok()); // an open paren is no error here
        assert!(metric_names("a{b=\"c}").is_err());
    }
}
