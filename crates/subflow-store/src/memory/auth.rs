//! [`AuthStore`] for [`MemoryStore`]: users and tokens under a lock of their own.

use std::sync::Mutex;

use async_trait::async_trait;

use crate::auth::{
    AuthStore, NewToken, TokenOwner, TokenRecord, User, new_auth_id, validate_new_token,
    validate_user_name,
};
use crate::{Error, MemoryStore, Result, now_rfc3339};

/// The in-memory users and tokens of [`crate::MemoryStore`].
#[derive(Debug, Default)]
pub(super) struct MemoryAuth {
    inner: Mutex<AuthTables>,
}

#[derive(Debug, Default)]
struct AuthTables {
    /// In creation order.
    users: Vec<User>,
    /// (digest, token), in creation order.
    tokens: Vec<(String, TokenRecord)>,
}

impl MemoryAuth {
    fn lock(&self) -> std::sync::MutexGuard<'_, AuthTables> {
        // Every mutation below is a single push or field write: nothing half-applied.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl AuthStore for MemoryStore {
    async fn add_user(&self, name: &str) -> Result<User> {
        validate_user_name(name)?;
        let mut tables = self.auth.lock();
        if tables.users.iter().any(|u| u.name == name) {
            return Err(Error::UserExists(name.to_owned()));
        }
        let user = User {
            id: new_auth_id(),
            name: name.to_owned(),
            disabled: false,
            created_at: now_rfc3339(),
        };
        tables.users.push(user.clone());
        Ok(user)
    }

    async fn list_users(&self) -> Result<Vec<User>> {
        Ok(self.auth.lock().users.clone())
    }

    async fn find_user(&self, id_or_name: &str) -> Result<Option<User>> {
        let tables = self.auth.lock();
        Ok(tables
            .users
            .iter()
            .find(|u| u.id == id_or_name)
            .or_else(|| tables.users.iter().find(|u| u.name == id_or_name))
            .cloned())
    }

    async fn disable_user(&self, user_id: &str) -> Result<bool> {
        let mut tables = self.auth.lock();
        let Some(user) = tables.users.iter_mut().find(|u| u.id == user_id) else {
            return Ok(false);
        };
        user.disabled = true;
        Ok(true)
    }

    async fn create_token(&self, token: NewToken) -> Result<TokenRecord> {
        validate_new_token(&token)?;
        let mut tables = self.auth.lock();
        if !tables.users.iter().any(|u| u.id == token.user_id) {
            return Err(Error::UnknownUser(token.user_id));
        }
        if tables
            .tokens
            .iter()
            .any(|(digest, _)| *digest == token.digest)
        {
            return Err(Error::InvalidToken(
                "the digest is already stored".to_owned(),
            ));
        }
        let record = token.to_record();
        tables.tokens.push((token.digest, record.clone()));
        Ok(record)
    }

    async fn list_tokens(&self, user_id: Option<&str>) -> Result<Vec<TokenRecord>> {
        Ok(self
            .auth
            .lock()
            .tokens
            .iter()
            .map(|(_, token)| token)
            .filter(|token| user_id.is_none_or(|id| token.user_id == id))
            .cloned()
            .collect())
    }

    async fn revoke_token(&self, token_id: &str) -> Result<bool> {
        let mut tables = self.auth.lock();
        let Some((_, token)) = tables.tokens.iter_mut().find(|(_, t)| t.id == token_id) else {
            return Ok(false);
        };
        token.revoked_at.get_or_insert_with(now_rfc3339);
        Ok(true)
    }

    async fn find_token(&self, digest: &str) -> Result<Option<TokenOwner>> {
        let tables = self.auth.lock();
        let Some((_, token)) = tables.tokens.iter().find(|(d, _)| d == digest) else {
            return Ok(None);
        };
        let Some(user) = tables.users.iter().find(|u| u.id == token.user_id) else {
            return Ok(None);
        };
        Ok(Some(TokenOwner {
            token: token.clone(),
            user: user.clone(),
        }))
    }

    async fn touch_token(&self, token_id: &str) -> Result<()> {
        let mut tables = self.auth.lock();
        if let Some((_, token)) = tables.tokens.iter_mut().find(|(_, t)| t.id == token_id) {
            token.last_used_at = Some(now_rfc3339());
        }
        Ok(())
    }
}
