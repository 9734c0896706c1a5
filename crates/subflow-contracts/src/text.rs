//! Character-counted text caps. Characters are Unicode scalar values.

/// Returns the first `cap` characters of `text` and whether anything was cut.
/// The cut always falls on a character boundary.
pub fn cap_chars(text: &str, cap: usize) -> (&str, bool) {
    match text.char_indices().nth(cap) {
        Some((byte_index, _)) => (&text[..byte_index], true),
        None => (text, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
