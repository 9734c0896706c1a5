//! Permissions and the bearer token format (docs/api.md#auth-and-ownership).
//!
//! A token is `sf_` followed by 43 base64url characters (256 random bits). It is shown
//! once and stored only as the lowercase hex SHA-256 of its text, [`token_digest`].
//! Generating tokens is the binary's job (it needs the OS random source); this module
//! only names the format, so the gateway can refuse a malformed token without a lookup.

use std::collections::BTreeSet;
use std::fmt;

use crate::status::UnknownValue;
use crate::task_result::sha256_hex;

string_enum! {
    /// A permission a token grants (docs/api.md#auth-and-ownership); [`Permission::Admin`] implies every other.
    pub enum Permission {
        /// Read threads, their state and history, and their token usage.
        ThreadsRead = "threads:read",
        /// Create and delete threads.
        ThreadsWrite = "threads:write",
        /// Read runs, join them and page their events.
        RunsRead = "runs:read",
        /// Start and cancel runs.
        RunsWrite = "runs:write",
        /// Everything.
        Admin = "admin",
    }
}

/// The permissions of a token: a set, kept in [`Permission::ALL`] order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Permissions(BTreeSet<Permission>);

impl Permissions {
    /// Every permission: what the implicit local user holds.
    pub fn admin() -> Self {
        Permissions::from_iter([Permission::Admin])
    }

    /// Parses a comma-separated list such as `runs:read,runs:write`; blanks around
    /// names are ignored, an empty name or an unknown one is an error.
    pub fn parse_list(text: &str) -> Result<Self, UnknownValue> {
        text.split(',')
            .map(|name| name.trim().parse::<Permission>())
            .collect()
    }

    /// Whether these permissions allow `needed`: they hold it, or hold `admin`.
    pub fn allows(&self, needed: Permission) -> bool {
        self.0.contains(&needed) || self.0.contains(&Permission::Admin)
    }

    /// Whether no permission is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The permissions held, in [`Permission::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = Permission> + '_ {
        self.0.iter().copied()
    }
}

impl FromIterator<Permission> for Permissions {
    fn from_iter<I: IntoIterator<Item = Permission>>(permissions: I) -> Self {
        Permissions(permissions.into_iter().collect())
    }
}

/// The comma-separated list [`Permissions::parse_list`] reads.
impl fmt::Display for Permissions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, permission) in self.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            f.write_str(permission.as_str())?;
        }
        Ok(())
    }
}

/// What every token starts with.
pub const TOKEN_PREFIX: &str = "sf_";

/// Base64url characters after the prefix: 32 random bytes without padding.
pub const TOKEN_SECRET_CHARS: usize = 43;

/// Whether `text` has the token format: `sf_` and 43 base64url characters.
pub fn is_well_formed_token(text: &str) -> bool {
    text.strip_prefix(TOKEN_PREFIX).is_some_and(|secret| {
        secret.len() == TOKEN_SECRET_CHARS
            && secret
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// The only form in which a token is stored: the lowercase hex SHA-256 of its text.
pub fn token_digest(token: &str) -> String {
    sha256_hex(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_names_are_the_frozen_ones() {
        let names: Vec<&str> = Permission::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "threads:read",
                "threads:write",
                "runs:read",
                "runs:write",
                "admin"
            ]
        );
    }

    #[test]
    fn lists_parse_into_sets_and_print_back_in_a_fixed_order() {
        let parsed = Permissions::parse_list("runs:write, threads:read,runs:write").unwrap();
        assert_eq!(parsed.to_string(), "threads:read,runs:write");
        assert_eq!(
            Permissions::parse_list(&parsed.to_string()).unwrap(),
            parsed
        );
        let error = Permissions::parse_list("runs:read,runs:delete").unwrap_err();
        assert_eq!(error.value, "runs:delete");
        assert!(Permissions::parse_list("").is_err());
        assert!(Permissions::parse_list("runs:read,").is_err());
    }

    #[test]
    fn admin_implies_every_permission_and_others_imply_only_themselves() {
        let admin = Permissions::admin();
        assert!(Permission::ALL.iter().all(|p| admin.allows(*p)));
        let reader = Permissions::parse_list("runs:read").unwrap();
        assert!(reader.allows(Permission::RunsRead));
        for other in Permission::ALL
            .iter()
            .filter(|p| **p != Permission::RunsRead)
        {
            assert!(!reader.allows(*other), "{other}");
        }
        assert!(!Permissions::default().allows(Permission::ThreadsRead));
    }

    #[test]
    fn only_the_prefix_and_43_base64url_characters_make_a_token() {
        let secret = "A".repeat(42) + "_";
        assert!(is_well_formed_token(&format!("sf_{secret}")));
        assert!(is_well_formed_token(&format!(
            "sf_{}",
            "-9zZ".repeat(10) + "abc"
        )));
        assert!(!is_well_formed_token(&format!("sf_{secret}A")));
        assert!(!is_well_formed_token(&format!("sf_{}", &secret[1..])));
        assert!(!is_well_formed_token(&format!("sk_{secret}")));
        assert!(!is_well_formed_token(&format!("sf_{}=", &secret[1..])));
        assert!(!is_well_formed_token(&format!("sf_{}é", &secret[2..])));
        assert!(!is_well_formed_token(""));
    }

    #[test]
    fn the_digest_is_lowercase_hex_sha256() {
        assert_eq!(
            token_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
