//! The Prometheus text exposition format (0.0.4) as ptxd writes it: `# HELP`
//! and `# TYPE` lines, samples with their labels, histograms (cumulative
//! buckets, `+Inf`, `_sum`, `_count`), and the escaping of help text and
//! label values. What to write is [`super::Metrics::render`]'s business.

use std::fmt::{self, Write as _};

use super::HistogramSnapshot;

/// The content type of the Prometheus text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A text exposition being written.
pub(super) struct Exposition(pub(super) String);

impl Exposition {
    fn write(&mut self, args: fmt::Arguments<'_>) {
        // Formatting into a String only fails if a Display impl does, and
        // only integers, floats and strs are written here.
        let _ = self.0.write_fmt(args);
    }

    pub(super) fn family(&mut self, name: &str, kind: &str, help: &str) {
        self.write(format_args!("# HELP {name} {}\n", escape_help(help)));
        self.write(format_args!("# TYPE {name} {kind}\n"));
    }

    fn labels(&mut self, labels: &[(&str, &str)]) {
        if labels.is_empty() {
            return;
        }
        self.0.push('{');
        for (index, (name, value)) in labels.iter().enumerate() {
            if index > 0 {
                self.0.push(',');
            }
            self.write(format_args!("{name}=\"{}\"", escape_label_value(value)));
        }
        self.0.push('}');
    }

    pub(super) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.0.push_str(name);
        self.labels(labels);
        self.write(format_args!(" {value}\n"));
    }

    pub(super) fn histogram(
        &mut self,
        name: &str,
        label: (&str, &str),
        snapshot: &HistogramSnapshot,
    ) {
        let bucket = format!("{name}_bucket");
        for (bound, count) in snapshot.bounds.iter().zip(&snapshot.cumulative) {
            let le = bound.to_string();
            self.sample(&bucket, &[label, ("le", &le)], *count);
        }
        self.sample(&bucket, &[label, ("le", "+Inf")], snapshot.count);
        self.0.push_str(name);
        self.0.push_str("_sum");
        self.labels(&[label]);
        self.write(format_args!(" {}\n", snapshot.sum_seconds));
        self.sample(&format!("{name}_count"), &[label], snapshot.count);
    }
}

fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::tests::parse;
    use super::super::Metrics;

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::new(1);
        let odd = "GPU-\"quoted\"\\back\nline";
        metrics.record_kernel_fault(odd);
        let parsed = parse(&metrics);
        assert_eq!(
            parsed.value("ptxd_kernel_faults_total", &[("device", odd)]),
            Some(1.0)
        );
    }
}
