//! Character-counted text caps (characters are Unicode scalar values) and the trimming
//! the task card shares with JavaScript.

use serde_json::Value;

/// Returns the first `cap` characters of `text` and whether anything was cut.
/// The cut always falls on a character boundary.
pub fn cap_chars(text: &str, cap: usize) -> (&str, bool) {
    // A text of at most `cap` bytes has at most `cap` characters: nothing to count.
    if text.len() <= cap {
        return (text, false);
    }
    match text.char_indices().nth(cap) {
        Some((byte_index, _)) => (&text[..byte_index], true),
        None => (text, false),
    }
}

/// Whether JavaScript's `String.prototype.trim` removes `c`: Unicode white space, plus the
/// byte order mark and minus U+0085 (NEXT LINE), which JavaScript keeps.
pub fn is_js_whitespace(c: char) -> bool {
    c == '\u{feff}' || (c.is_whitespace() && c != '\u{85}')
}

/// `text` trimmed as JavaScript trims it, so the web UI and the CLI agree on what is blank.
pub fn js_trim(text: &str) -> &str {
    text.trim_matches(is_js_whitespace)
}

/// Flattens message content to text: a string as is; a list joins its string items and
/// object `text` fields with `\n`, skipping empties; anything else is empty.
pub fn flatten_content(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|item| match item {
                Value::String(text) => Some(text.as_str()),
                Value::Object(block) => block.get("text").and_then(Value::as_str),
                _ => None,
            })
            .filter(|text| !text.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn trims_like_javascript() {
        assert_eq!(js_trim("\u{feff} a\u{3000}\n"), "a");
        assert_eq!(js_trim("\u{85}a"), "\u{85}a");
        assert_eq!(js_trim("\t\u{a0}\u{2028}"), "");
    }

    #[test]
    fn counts_characters_not_bytes() {
        assert_eq!(cap_chars("héllo", 2), ("hé", true));
        assert_eq!(cap_chars("日本語", 3), ("日本語", false));
        assert_eq!(cap_chars("", 0), ("", false));
        assert_eq!(cap_chars("a", 0), ("", true));
    }

    proptest! {
        #[test]
        fn the_cut_is_a_prefix_of_exactly_cap_characters(text in "\\PC{0,40}", cap in 0usize..50) {
            let (kept, cut) = cap_chars(&text, cap);
            prop_assert!(text.starts_with(kept));
            prop_assert_eq!(kept.chars().count(), cap.min(text.chars().count()));
            prop_assert_eq!(cut, text.chars().count() > cap);
        }
    }
}
