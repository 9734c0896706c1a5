//! Users and API tokens (docs/api.md#auth-and-ownership) and the trait that stores them.
//!
//! A token's text never reaches the store: callers hand over its SHA-256 digest
//! ([`subflow_contracts::auth::token_digest`]) and look tokens up by that digest. Whether
//! a found token may authenticate (revoked, expired, disabled user) is decided here, in
//! [`TokenOwner::refusal`], so every backend and the gateway agree.

use std::time::Duration;

use async_trait::async_trait;
use subflow_contracts::Permissions;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::{Error, Result, now_rfc3339, rfc3339};

/// Longest user name.
pub const USER_NAME_MAX_CHARS: usize = 64;

/// Longest token name.
pub const TOKEN_NAME_MAX_CHARS: usize = 128;

/// How stale `last_used_at` may get before a use writes it again: one write per token
/// per minute at most, so authenticating stays a read.
pub const TOUCH_INTERVAL: Duration = Duration::from_secs(60);

/// A user (docs/api.md#auth-and-ownership).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Store-assigned id (a UUID v7 string); threads record it as their owner.
    pub id: String,
    /// Unique name.
    pub name: String,
    /// A disabled user's tokens authenticate no request.
    pub disabled: bool,
    /// RFC 3339.
    pub created_at: String,
}

/// A token to store. Only its digest is given; the store never sees the token.
#[derive(Clone, PartialEq, Eq)]
pub struct NewToken {
    /// The owning user's id.
    pub user_id: String,
    /// A label for people, e.g. `ci`.
    pub name: Option<String>,
    /// What the token may do; at least one permission.
    pub permissions: Permissions,
    /// When it stops authenticating; never when `None`.
    pub expires_at: Option<OffsetDateTime>,
    /// Lowercase hex SHA-256 of the token.
    pub digest: String,
}

/// The digest is as good as a password for a database reader; keep it out of logs.
impl std::fmt::Debug for NewToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewToken")
            .field("user_id", &self.user_id)
            .field("name", &self.name)
            .field("permissions", &self.permissions)
            .field("expires_at", &self.expires_at)
            .field("digest", &"<redacted>")
            .finish()
    }
}

/// A stored token, without its digest (docs/api.md#auth-and-ownership token record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// Store-assigned id (a UUID v7 string), what `subflow tokens revoke` takes.
    pub id: String,
    /// The owning user's id.
    pub user_id: String,
    /// A label for people.
    pub name: Option<String>,
    /// What the token may do.
    pub permissions: Permissions,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339; never expires when `None`.
    pub expires_at: Option<String>,
    /// RFC 3339 of a recent use, at most [`TOUCH_INTERVAL`] stale.
    pub last_used_at: Option<String>,
    /// RFC 3339 of the first revocation.
    pub revoked_at: Option<String>,
}

impl TokenRecord {
    /// Whether a use at `now` should write `last_used_at` (never written, or older
    /// than [`TOUCH_INTERVAL`]).
    pub fn needs_touch(&self, now: OffsetDateTime) -> bool {
        match self.last_used_at.as_deref().map(parse_time) {
            Some(Some(last)) => now - last >= TOUCH_INTERVAL,
            _ => true,
        }
    }
}

/// A token found by its digest, with its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenOwner {
    /// The token.
    pub token: TokenRecord,
    /// Its user.
    pub user: User,
}

/// Why a stored token authenticates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It was revoked.
    Revoked,
    /// Its `expires_at` has passed (or does not parse).
    Expired,
    /// Its user is disabled.
    UserDisabled,
}

impl Refusal {
    /// A short reason for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Revoked => "revoked",
            Refusal::Expired => "expired",
            Refusal::UserDisabled => "user disabled",
        }
    }
}

impl TokenOwner {
    /// Why the token may not authenticate a request at `now`; `None` when it may.
    pub fn refusal(&self, now: OffsetDateTime) -> Option<Refusal> {
        if self.token.revoked_at.is_some() {
            return Some(Refusal::Revoked);
        }
        if let Some(expires_at) = &self.token.expires_at {
            // A value that does not parse fails closed.
            match parse_time(expires_at) {
                Some(expires_at) if now < expires_at => {}
                _ => return Some(Refusal::Expired),
            }
        }
        if self.user.disabled {
            return Some(Refusal::UserDisabled);
        }
        None
    }
}

fn parse_time(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &Rfc3339).ok()
}

/// Checks a user name: 1–64 characters from `A-Z a-z 0-9 . _ @ -`.
pub fn validate_user_name(name: &str) -> Result<()> {
    let valid = (1..=USER_NAME_MAX_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidUserName(name.to_owned()))
    }
}

/// Checks a token before it is stored: a 64-character lowercase hex digest, at least
/// one permission, a name of at most 128 characters.
pub fn validate_new_token(token: &NewToken) -> Result<()> {
    let hex_digest = token.digest.len() == 64
        && token
            .digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex_digest {
        return Err(Error::InvalidToken(
            "the digest must be 64 lowercase hex characters".to_owned(),
        ));
    }
    if token.permissions.is_empty() {
        return Err(Error::InvalidToken(
            "a token needs at least one permission".to_owned(),
        ));
    }
    if token
        .name
        .as_ref()
        .is_some_and(|name| name.chars().count() > TOKEN_NAME_MAX_CHARS)
    {
        return Err(Error::InvalidToken(format!(
            "a token name has at most {TOKEN_NAME_MAX_CHARS} characters"
        )));
    }
    Ok(())
}

/// A fresh store-assigned id: a UUID v7, so ids sort by creation.
pub fn new_auth_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

impl NewToken {
    /// The record a store writes for this token, stamped now with a fresh id.
    pub fn to_record(&self) -> TokenRecord {
        TokenRecord {
            id: new_auth_id(),
            user_id: self.user_id.clone(),
            name: self.name.clone(),
            permissions: self.permissions.clone(),
            created_at: now_rfc3339(),
            expires_at: self.expires_at.map(rfc3339),
            last_used_at: None,
            revoked_at: None,
        }
    }
}

/// Storage of users and tokens.
#[async_trait]
pub trait AuthStore: Send + Sync + std::fmt::Debug {
    /// Creates an enabled user; [`Error::UserExists`] if the name is taken,
    /// [`Error::InvalidUserName`] if it is not a valid name.
    async fn add_user(&self, name: &str) -> Result<User>;

    /// Every user, in creation order.
    async fn list_users(&self) -> Result<Vec<User>>;

    /// The user with this id, else the one with this name.
    async fn find_user(&self, id_or_name: &str) -> Result<Option<User>>;

    /// Disables a user; false when there is no user with this id.
    async fn disable_user(&self, user_id: &str) -> Result<bool>;

    /// Stores a token; [`Error::UnknownUser`] if its user does not exist,
    /// [`Error::InvalidToken`] if it fails [`validate_new_token`] or its digest is taken.
    async fn create_token(&self, token: NewToken) -> Result<TokenRecord>;

    /// Tokens in creation order, of one user when `user_id` is given.
    async fn list_tokens(&self, user_id: Option<&str>) -> Result<Vec<TokenRecord>>;

    /// Revokes a token, keeping the first `revoked_at`; false when there is no such token.
    async fn revoke_token(&self, token_id: &str) -> Result<bool>;

    /// The token with this digest and its user, whatever their state.
    async fn find_token(&self, digest: &str) -> Result<Option<TokenOwner>>;

    /// Sets a token's `last_used_at` to now; unknown ids are ignored.
    async fn touch_token(&self, token_id: &str) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use subflow_contracts::Permission;

    fn owner(token: TokenRecord, disabled: bool) -> TokenOwner {
        TokenOwner {
            token,
            user: User {
                id: "u1".into(),
                name: "ana".into(),
                disabled,
                created_at: now_rfc3339(),
            },
        }
    }

    fn token() -> TokenRecord {
        TokenRecord {
            id: "t1".into(),
            user_id: "u1".into(),
            name: None,
            permissions: Permissions::from_iter([Permission::RunsRead]),
            created_at: now_rfc3339(),
            expires_at: None,
            last_used_at: None,
            revoked_at: None,
        }
    }

    #[test]
    fn revoked_expired_and_disabled_tokens_are_refused_with_their_reason() {
        let now = OffsetDateTime::now_utc();
        assert_eq!(owner(token(), false).refusal(now), None);
        let revoked = TokenRecord {
            revoked_at: Some(now_rfc3339()),
            ..token()
        };
        assert_eq!(owner(revoked, false).refusal(now), Some(Refusal::Revoked));
        let later = TokenRecord {
            expires_at: Some(rfc3339(now + Duration::from_secs(60))),
            ..token()
        };
        assert_eq!(owner(later.clone(), false).refusal(now), None);
        assert_eq!(
            owner(later, false).refusal(now + Duration::from_secs(60)),
            Some(Refusal::Expired),
            "a token is expired at its expires_at"
        );
        let garbled = TokenRecord {
            expires_at: Some("next week".into()),
            ..token()
        };
        assert_eq!(owner(garbled, false).refusal(now), Some(Refusal::Expired));
        assert_eq!(
            owner(token(), true).refusal(now),
            Some(Refusal::UserDisabled)
        );
    }

    #[test]
    fn last_used_at_is_written_at_most_once_a_minute() {
        let now = OffsetDateTime::now_utc();
        assert!(token().needs_touch(now));
        let fresh = TokenRecord {
            last_used_at: Some(rfc3339(now)),
            ..token()
        };
        assert!(!fresh.needs_touch(now + Duration::from_secs(59)));
        assert!(fresh.needs_touch(now + TOUCH_INTERVAL));
    }

    #[test]
    fn user_names_are_short_plain_words() {
        for good in ["ana", "ci-bot", "ana.lopez@example.com", "A_1"] {
            assert!(validate_user_name(good).is_ok(), "{good}");
        }
        let long = "a".repeat(USER_NAME_MAX_CHARS + 1);
        for bad in ["", "two words", "ana/x", "名前", long.as_str()] {
            assert!(
                matches!(validate_user_name(bad), Err(Error::InvalidUserName(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_new_token_needs_a_hex_digest_and_a_permission() {
        let good = NewToken {
            user_id: "u1".into(),
            name: Some("ci".into()),
            permissions: Permissions::admin(),
            expires_at: None,
            digest: "ab".repeat(32),
        };
        assert!(validate_new_token(&good).is_ok());
        for bad in [
            NewToken {
                digest: "AB".repeat(32),
                ..good.clone()
            },
            NewToken {
                digest: "sf_secret".into(),
                ..good.clone()
            },
            NewToken {
                permissions: Permissions::default(),
                ..good.clone()
            },
            NewToken {
                name: Some("n".repeat(TOKEN_NAME_MAX_CHARS + 1)),
                ..good.clone()
            },
        ] {
            assert!(matches!(
                validate_new_token(&bad),
                Err(Error::InvalidToken(_))
            ));
        }
        assert!(!format!("{good:?}").contains(&good.digest));
    }
}
