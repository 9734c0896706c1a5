//! Whole numbers in request bodies. JSON Schema's `integer` is a mathematical integer, so
//! `10.0` is one and a client built from the document may write it so, while serde's
//! `u32` takes only `10`. These readers take both, and no other number.

use serde::de::Error;
use serde::{Deserialize, Deserializer};
use serde_json::Number;

/// An optional `u32`, for `#[serde(default, deserialize_with = ..)]`: absent, null, or a
/// whole number from 0 to 4294967295, with or without a zero fraction.
pub fn option_whole_u32<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u32>, D::Error> {
    Option::<Number>::deserialize(deserializer)?
        .map(|number| read(&number))
        .transpose()
}

/// A `u64`, for `#[serde(deserialize_with = ..)]`: a whole number from 0 to 2^64 - 1, with
/// or without a zero fraction.
pub fn whole_u64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    read(&Number::deserialize(deserializer)?)
}

/// Whether a count is 0, for `skip_serializing_if` on counts present only when > 0.
pub fn is_zero(count: &u64) -> bool {
    *count == 0
}

fn read<T: TryFrom<u64> + Bounded, E: Error>(number: &Number) -> Result<T, E> {
    whole(number)
        .and_then(|w| T::try_from(w).ok())
        .ok_or_else(|| {
            E::custom(format!(
                "expected a whole number from 0 to {}, got {number}",
                T::MAX
            ))
        })
}

fn whole(number: &Number) -> Option<u64> {
    if let Some(whole) = number.as_u64() {
        return Some(whole);
    }
    let float = number.as_f64()?;
    // 2^64, the first float past u64::MAX; below it, a float without a fraction converts exactly.
    const END: f64 = 18_446_744_073_709_551_616.0;
    (float.fract() == 0.0 && (0.0..END).contains(&float)).then_some(float as u64)
}

/// The largest value, for the error message.
trait Bounded: std::fmt::Display {
    const MAX: Self;
}

impl Bounded for u32 {
    const MAX: Self = u32::MAX;
}

impl Bounded for u64 {
    const MAX: Self = u64::MAX;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[derive(Debug, serde::Deserialize)]
    struct Page {
        #[serde(default, deserialize_with = "super::option_whole_u32")]
        limit: Option<u32>,
    }

    fn check(body: serde_json::Value, expect: Option<Option<u32>>) {
        let read = serde_json::from_value::<Page>(body.clone())
            .ok()
            .map(|p| p.limit);
        assert_eq!(read, expect, "{body}");
    }

    #[test]
    fn whole_numbers_are_read_with_or_without_a_zero_fraction_and_nothing_else() {
        check(json!({}), Some(None));
        check(json!({"limit": null}), Some(None));
        check(json!({"limit": 0}), Some(Some(0)));
        check(json!({"limit": 10}), Some(Some(10)));
        check(json!({"limit": 10.0}), Some(Some(10)));
        check(json!({"limit": -0.0}), Some(Some(0)));
        check(json!({"limit": 4_294_967_295_u64}), Some(Some(u32::MAX)));
        check(json!({"limit": 4_294_967_295.0}), Some(Some(u32::MAX)));
        check(json!({"limit": 4_294_967_296_u64}), None);
        check(json!({"limit": 4_294_967_296.0}), None);
        check(json!({"limit": 10.5}), None);
        check(json!({"limit": -1}), None);
        check(json!({"limit": 1e300}), None);
        check(json!({"limit": "10"}), None);
        check(json!({"limit": true}), None);
    }

    #[test]
    fn token_counts_are_whole_numbers_up_to_the_largest_u64() {
        #[derive(Debug, serde::Deserialize)]
        struct Count(#[serde(deserialize_with = "super::whole_u64")] u64);
        let read = |text: &str| serde_json::from_str::<Count>(text).ok().map(|c| c.0);
        assert_eq!(read("161424.0"), Some(161_424));
        assert_eq!(read("18446744073709551615"), Some(u64::MAX));
        assert_eq!(read("18446744073709551616.0"), None);
        assert_eq!(read("1.5"), None);
        assert_eq!(read("-3"), None);
    }
}
