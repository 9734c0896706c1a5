//! Users and tokens (docs/api.md#auth-and-ownership) with the semantics of `MemoryStore`.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use subflow_store::auth::{new_auth_id, validate_new_token, validate_user_name};
use subflow_store::{
    AuthStore, Error, NewToken, Result, TokenOwner, TokenRecord, User, codec, now_rfc3339,
};

use crate::{PostgresStore, get};

/// The `SELECT` of every column [`user_from_row`] reads, as a literal for `concat!`.
macro_rules! select_users {
    () => {
        "SELECT id, name, disabled, created_at FROM users"
    };
}

/// The `SELECT` of every column [`token_from_row`] reads, as a literal for `concat!`.
macro_rules! select_tokens {
    () => {
        "SELECT id, user_id, name, permissions, created_at, expires_at, last_used_at, \
         revoked_at FROM tokens"
    };
}

fn user_from_row(row: &PgRow) -> Result<User> {
    Ok(User {
        id: get(row, "id")?,
        name: get(row, "name")?,
        disabled: get(row, "disabled")?,
        created_at: get(row, "created_at")?,
    })
}

fn token_from_row(row: &PgRow) -> Result<TokenRecord> {
    Ok(TokenRecord {
        id: get(row, "id")?,
        user_id: get(row, "user_id")?,
        name: get(row, "name")?,
        permissions: codec::permissions("tokens.permissions", get(row, "permissions")?)?,
        created_at: get(row, "created_at")?,
        expires_at: get(row, "expires_at")?,
        last_used_at: get(row, "last_used_at")?,
        revoked_at: get(row, "revoked_at")?,
    })
}

#[async_trait]
impl AuthStore for PostgresStore {
    async fn add_user(&self, name: &str) -> Result<User> {
        validate_user_name(name)?;
        let user = User {
            id: new_auth_id(),
            name: name.to_owned(),
            disabled: false,
            created_at: now_rfc3339(),
        };
        let inserted = sqlx::query(
            "INSERT INTO users (id, name, disabled, created_at) VALUES ($1, $2, FALSE, $3) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(&user.id)
        .bind(&user.name)
        .bind(&user.created_at)
        .execute(self.pool())
        .await
        .map_err(Error::backend)?;
        if inserted.rows_affected() == 0 {
            return Err(Error::UserExists(user.name));
        }
        Ok(user)
    }

    async fn list_users(&self) -> Result<Vec<User>> {
        let rows = sqlx::query(concat!(
            select_users!(),
            " ORDER BY created_at, id COLLATE \"C\""
        ))
        .fetch_all(self.pool())
        .await
        .map_err(Error::backend)?;
        rows.iter().map(user_from_row).collect()
    }

    async fn find_user(&self, id_or_name: &str) -> Result<Option<User>> {
        // An id match wins over a name match.
        let row = sqlx::query(concat!(
            select_users!(),
            " WHERE id = $1 OR name = $1 ORDER BY id = $1 DESC LIMIT 1"
        ))
        .bind(id_or_name)
        .fetch_optional(self.pool())
        .await
        .map_err(Error::backend)?;
        row.as_ref().map(user_from_row).transpose()
    }

    async fn disable_user(&self, user_id: &str) -> Result<bool> {
        let updated = sqlx::query("UPDATE users SET disabled = TRUE WHERE id = $1")
            .bind(user_id)
            .execute(self.pool())
            .await
            .map_err(Error::backend)?;
        Ok(updated.rows_affected() > 0)
    }

    async fn create_token(&self, token: NewToken) -> Result<TokenRecord> {
        validate_new_token(&token)?;
        let record = token.to_record();
        // Users are never deleted, so the check and the insert need no lock; the
        // foreign key backs the check up.
        let user_exists = sqlx::query("SELECT 1 FROM users WHERE id = $1")
            .bind(&record.user_id)
            .fetch_optional(self.pool())
            .await
            .map_err(Error::backend)?
            .is_some();
        if !user_exists {
            return Err(Error::UnknownUser(record.user_id));
        }
        let inserted = sqlx::query(
            "INSERT INTO tokens (id, user_id, digest, name, permissions, created_at, \
             expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (digest) DO NOTHING",
        )
        .bind(&record.id)
        .bind(&record.user_id)
        .bind(&token.digest)
        .bind(&record.name)
        .bind(record.permissions.to_string())
        .bind(&record.created_at)
        .bind(&record.expires_at)
        .execute(self.pool())
        .await
        .map_err(Error::backend)?;
        if inserted.rows_affected() == 0 {
            return Err(Error::InvalidToken(
                "the digest is already stored".to_owned(),
            ));
        }
        Ok(record)
    }

    async fn list_tokens(&self, user_id: Option<&str>) -> Result<Vec<TokenRecord>> {
        let rows = sqlx::query(concat!(
            select_tokens!(),
            " WHERE $1::text IS NULL OR user_id = $1",
            " ORDER BY created_at, id COLLATE \"C\""
        ))
        .bind(user_id)
        .fetch_all(self.pool())
        .await
        .map_err(Error::backend)?;
        rows.iter().map(token_from_row).collect()
    }

    async fn revoke_token(&self, token_id: &str) -> Result<bool> {
        // The first revocation's time is kept; a repeat still reports the token.
        let updated =
            sqlx::query("UPDATE tokens SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1")
                .bind(token_id)
                .bind(now_rfc3339())
                .execute(self.pool())
                .await
                .map_err(Error::backend)?;
        Ok(updated.rows_affected() > 0)
    }

    async fn find_token(&self, digest: &str) -> Result<Option<TokenOwner>> {
        // One round trip: this runs on every authenticated request.
        let row = sqlx::query(
            "SELECT t.id, t.user_id, t.name, t.permissions, t.created_at, t.expires_at, \
             t.last_used_at, t.revoked_at, u.name AS user_name, u.disabled AS user_disabled, \
             u.created_at AS user_created_at \
             FROM tokens t JOIN users u ON u.id = t.user_id WHERE t.digest = $1",
        )
        .bind(digest)
        .fetch_optional(self.pool())
        .await
        .map_err(Error::backend)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let token = token_from_row(&row)?;
        let user = User {
            id: token.user_id.clone(),
            name: get(&row, "user_name")?,
            disabled: get(&row, "user_disabled")?,
            created_at: get(&row, "user_created_at")?,
        };
        Ok(Some(TokenOwner { token, user }))
    }

    async fn touch_token(&self, token_id: &str) -> Result<()> {
        sqlx::query("UPDATE tokens SET last_used_at = $2 WHERE id = $1")
            .bind(token_id)
            .bind(now_rfc3339())
            .execute(self.pool())
            .await
            .map_err(Error::backend)?;
        Ok(())
    }
}
