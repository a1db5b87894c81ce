//! Client-supplied text on its way into a log line or a refusal message.
//!
//! Invariant: every string a client chose (device UUIDs, labels, symbols,
//! shared-memory names, handles, decode errors quoting the request) passes
//! through [`escape`] before it is written to a log or echoed back, so a
//! client cannot start a new log line, forge a field, or send terminal escape
//! sequences to an operator's screen. The one place that does it is
//! [`crate::error::Error::refusal`], which builds every refusal's message and
//! metadata; the gRPC layer logs only what that produced.

use std::borrow::Cow;

/// Is `c` a character that must not reach a log verbatim: a control
/// character (C0, DEL, C1), a Unicode line or paragraph separator, or a
/// bidirectional override that reorders what an operator reads?
fn must_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character written as an escape (`\n`, `\r`,
/// `\t`, `\u{1b}`, ...); borrowed unchanged when there is none.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(must_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if must_escape(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(escape("GPU-1234 ok"), Cow::Borrowed(_)));
        assert_eq!(escape("a\nb"), "a\\nb");
        assert_eq!(escape("a\r\n\tb"), "a\\r\\n\\tb");
        assert_eq!(escape("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(
            escape("x\u{7f}\u{85}\u{2028}\u{202e}y"),
            "x\\u{7f}\\u{85}\\u{2028}\\u{202e}y"
        );
        let escaped = escape("line\nforged=1\u{0}");
        assert!(!escaped.chars().any(|c| c.is_control()), "{escaped}");
        assert_eq!(escape("日本語 ü"), "日本語 ü");
    }
}
