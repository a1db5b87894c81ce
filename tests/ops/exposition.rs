//! A strict reader of the Prometheus text exposition format (0.0.4), for
//! tests: it rejects what Prometheus would reject (bad names, bad escapes,
//! duplicate series, samples without a `# TYPE`, interleaved families) and
//! the histogram mistakes promtool does not look for (non-cumulative buckets,
//! a missing `+Inf` bucket, `_count` disagreeing with it).
//!
//! Shared by `src/metrics/mod.rs`'s unit tests (through `#[path]`) and
//! `tests/ops.rs`.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

/// Label pairs, sorted by name.
pub type Labels = Vec<(String, String)>;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    /// Sorted by label name.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// A parsed, checked exposition.
#[derive(Debug, Default)]
pub struct Exposition {
    kinds: BTreeMap<String, String>,
    helps: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    valid_name(name) && !name.contains(':') && !name.starts_with("__")
}

fn parse_value(text: &str) -> Result<f64, String> {
    match text {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ if text
            .chars()
            .all(|c| c.is_ascii_digit() || "+-.eE".contains(c)) =>
        {
            text.parse::<f64>()
                .map_err(|error| format!("value {text:?}: {error}"))
        }
        _ => Err(format!("value {text:?} is not a number")),
    }
}

/// Parses `{a="x",b="y"}` at the start of `text`; returns the labels and the
/// rest of the line.
fn parse_labels(text: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    let mut rest = text
        .strip_prefix('{')
        .ok_or_else(|| "labels must start with {".to_owned())?;
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            break Ok((labels, after));
        }
        let (name, after) = rest
            .split_once("=\"")
            .ok_or_else(|| format!("label without =\" in {text:?}"))?;
        if !valid_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("unterminated label value in {text:?}")),
                Some((index, '"')) => break index,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape {other:?} in {text:?}")),
                },
                Some((_, '\n')) => return Err("raw newline in label value".to_owned()),
                Some((_, c)) => value.push(c),
            }
        };
        if labels.iter().any(|(existing, _)| existing == name) {
            return Err(format!("duplicate label {name:?}"));
        }
        labels.push((name.to_owned(), value));
        rest = &after[end + 1..];
        if let Some(after_comma) = rest.strip_prefix(',') {
            rest = after_comma;
        } else if !rest.starts_with('}') {
            return Err(format!("expected , or }} after a label in {text:?}"));
        }
    }
}

impl Exposition {
    pub fn parse(text: &str) -> Result<Exposition, String> {
        if !text.is_empty() && !text.ends_with('\n') {
            return Err("exposition must end with a newline".to_owned());
        }
        let mut parsed = Exposition::default();
        let mut finished_families = BTreeSet::new();
        let mut current_family: Option<String> = None;
        let mut seen_series = BTreeSet::new();
        for (number, line) in text.lines().enumerate() {
            let context = |error: String| format!("line {}: {error}: {line:?}", number + 1);
            if line.is_empty() {
                continue;
            }
            let family = if let Some(comment) = line.strip_prefix("# ") {
                let mut words = comment.splitn(3, ' ');
                match (words.next(), words.next(), words.next()) {
                    (Some("HELP"), Some(name), Some(help)) => {
                        if parsed
                            .helps
                            .insert(name.to_owned(), help.to_owned())
                            .is_some()
                        {
                            return Err(context("second HELP".to_owned()));
                        }
                        name.to_owned()
                    }
                    (Some("TYPE"), Some(name), Some(kind)) => {
                        if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind)
                        {
                            return Err(context(format!("unknown type {kind}")));
                        }
                        if parsed
                            .kinds
                            .insert(name.to_owned(), kind.to_owned())
                            .is_some()
                        {
                            return Err(context("second TYPE".to_owned()));
                        }
                        name.to_owned()
                    }
                    _ => continue, // other comments are allowed
                }
            } else {
                let name_end = line
                    .find(['{', ' '])
                    .ok_or_else(|| context("no value".to_owned()))?;
                let name = &line[..name_end];
                if !valid_name(name) {
                    return Err(context(format!("bad metric name {name:?}")));
                }
                let (mut labels, rest) = if line[name_end..].starts_with('{') {
                    parse_labels(&line[name_end..]).map_err(context)?
                } else {
                    (Vec::new(), &line[name_end..])
                };
                let mut fields = rest
                    .strip_prefix(' ')
                    .ok_or_else(|| context("no space before the value".to_owned()))?
                    .split(' ');
                let value = parse_value(fields.next().unwrap_or_default()).map_err(context)?;
                if let Some(timestamp) = fields.next() {
                    timestamp
                        .parse::<i64>()
                        .map_err(|error| context(format!("timestamp: {error}")))?;
                }
                if fields.next().is_some() {
                    return Err(context("trailing fields".to_owned()));
                }
                labels.sort();
                let family = parsed.family_of(name);
                let Some(kind) = parsed.kinds.get(&family) else {
                    return Err(context(format!("sample of {family} before its # TYPE")));
                };
                if kind == "counter" && !name.ends_with("_total") {
                    return Err(context("counter name without _total".to_owned()));
                }
                if kind == "counter" && (value.is_nan() || value < 0.0) {
                    return Err(context("negative counter".to_owned()));
                }
                if !seen_series.insert((name.to_owned(), labels.clone())) {
                    return Err(context("duplicate series".to_owned()));
                }
                parsed.samples.push(Sample {
                    name: name.to_owned(),
                    labels,
                    value,
                });
                family
            };
            if current_family.as_deref() != Some(family.as_str()) {
                if let Some(previous) = current_family.take() {
                    finished_families.insert(previous);
                }
                if finished_families.contains(&family) {
                    return Err(context(format!("family {family} interleaved")));
                }
                current_family = Some(family);
            }
        }
        parsed.check_histograms()?;
        parsed.check_limits()?;
        Ok(parsed)
    }

    /// The family a sample name belongs to: itself, or for a histogram's
    /// `_bucket`/`_sum`/`_count` the histogram.
    fn family_of(&self, name: &str) -> String {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if self.kinds.get(base).is_some_and(|kind| kind == "histogram") {
                    return base.to_owned();
                }
            }
        }
        name.to_owned()
    }

    fn check_histograms(&self) -> Result<(), String> {
        for (family, kind) in &self.kinds {
            if kind != "histogram" {
                continue;
            }
            let bucket_name = format!("{family}_bucket");
            // Per label set without `le`: (le, count) in order of appearance.
            let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
            for sample in self.samples.iter().filter(|s| s.name == bucket_name) {
                let le = sample
                    .labels
                    .iter()
                    .find(|(name, _)| name == "le")
                    .ok_or_else(|| format!("{bucket_name} without le"))?;
                let le = parse_value(&le.1)?;
                let rest = sample
                    .labels
                    .iter()
                    .filter(|(name, _)| name != "le")
                    .cloned()
                    .collect();
                series.entry(rest).or_default().push((le, sample.value));
            }
            for (labels, buckets) in series {
                for pair in buckets.windows(2) {
                    if !(pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1) {
                        return Err(format!(
                            "{family}{labels:?}: buckets not ascending/cumulative"
                        ));
                    }
                }
                let Some(&(f64::INFINITY, infinite)) = buckets.last() else {
                    return Err(format!("{family}{labels:?}: no +Inf bucket"));
                };
                let count = self
                    .samples
                    .iter()
                    .find(|s| s.name == format!("{family}_count") && s.labels == labels)
                    .ok_or_else(|| format!("{family}{labels:?}: no _count"))?;
                if count.value != infinite {
                    return Err(format!(
                        "{family}{labels:?}: _count {} != +Inf {}",
                        count.value, infinite
                    ));
                }
                if !self
                    .samples
                    .iter()
                    .any(|s| s.name == format!("{family}_sum") && s.labels == labels)
                {
                    return Err(format!("{family}{labels:?}: no _sum"));
                }
            }
        }
        Ok(())
    }

    /// ptxd's convention for a bounded resource: a gauge `X_limit` comes with
    /// a gauge `X` of the same labels, which never exceeds it.
    fn check_limits(&self) -> Result<(), String> {
        for (family, kind) in &self.kinds {
            let Some(base) = family.strip_suffix("_limit") else {
                continue;
            };
            if kind != "gauge" || self.kinds.get(base).map(String::as_str) != Some("gauge") {
                return Err(format!("{family} needs {family} and {base} both gauges"));
            }
            for limit in self.samples.iter().filter(|s| &s.name == family) {
                let used = self
                    .samples
                    .iter()
                    .find(|s| s.name == base && s.labels == limit.labels)
                    .ok_or_else(|| format!("{family}{:?} without {base}", limit.labels))?;
                if used.value > limit.value {
                    return Err(format!(
                        "{base}{:?} = {} exceeds {family} = {}",
                        limit.labels, used.value, limit.value
                    ));
                }
            }
        }
        Ok(())
    }

    /// The declared type of a family.
    pub fn kind(&self, family: &str) -> Option<&str> {
        self.kinds.get(family).map(String::as_str)
    }

    /// The value of the series with exactly these labels (in any order).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut wanted: Vec<(String, String)> = labels
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        wanted.sort();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == wanted)
            .map(|s| s.value)
    }
}

#[cfg(test)]
mod self_tests {
    use super::Exposition;

    #[test]
    fn the_reader_rejects_what_prometheus_rejects() {
        let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 3\n";
        assert!(Exposition::parse(good).is_ok());
        let within = "# TYPE b gauge\nb 2\n# TYPE b_limit gauge\nb_limit 2\n";
        assert!(Exposition::parse(within).is_ok());
        for bad in [
            "a_total 1\n",                                                   // no TYPE
            "# TYPE a_total counter\na_total{x=\"1} 1\n",                    // unterminated
            "# TYPE a_total counter\na_total{x=\"\\t\"} 1\n",                // bad escape
            "# TYPE a_total counter\na_total 1\na_total 2\n",                // duplicate
            "# TYPE a_total counter\na_total one\n",                         // value
            "# TYPE a counter\na 1\n",                                       // no _total
            "# TYPE a_total counter\n# TYPE b gauge\nb 1\na_total 1\n",      // interleaved
            "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
            "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", // no +Inf
            "# TYPE a_total counter\na_total 1", // no final newline
            "# TYPE b gauge\nb 3\n# TYPE b_limit gauge\nb_limit 2\n", // over its limit
            "# TYPE b_limit gauge\nb_limit 2\n",                  // a limit of nothing
        ] {
            assert!(Exposition::parse(bad).is_err(), "accepted {bad:?}");
        }
    }
}
