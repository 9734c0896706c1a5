//! Users and tokens (docs/api.md#auth-and-ownership) on SQLite, with the semantics of `MemoryStore`.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};
use subflow_store::auth::{new_auth_id, validate_new_token, validate_user_name};
use subflow_store::{
    AuthStore, Error, NewToken, Result, TokenOwner, TokenRecord, User, codec, now_rfc3339,
};

use crate::{Db, SqliteStore, query_all, text};

const USER_COLUMNS: &str = "id, name, disabled, created_at";

fn decode_user(row: &Row<'_>) -> Result<User> {
    Ok(User {
        id: row.get(0).db()?,
        name: row.get(1).db()?,
        disabled: row.get(2).db()?,
        created_at: row.get(3).db()?,
    })
}

/// Token columns, prefixed `t.` so they can be joined with `users u`.
const TOKEN_COLUMNS: &str = "t.id, t.user_id, t.name, t.permissions, t.created_at, \
     t.expires_at, t.last_used_at, t.revoked_at";

fn decode_token(row: &Row<'_>) -> Result<TokenRecord> {
    Ok(TokenRecord {
        id: row.get(0).db()?,
        user_id: row.get(1).db()?,
        name: row.get(2).db()?,
        permissions: codec::permissions("tokens.permissions", text(row, 3)?)?,
        created_at: row.get(4).db()?,
        expires_at: row.get(5).db()?,
        last_used_at: row.get(6).db()?,
        revoked_at: row.get(7).db()?,
    })
}

#[async_trait]
impl AuthStore for SqliteStore {
    async fn add_user(&self, name: &str) -> Result<User> {
        validate_user_name(name)?;
        let user = User {
            id: new_auth_id(),
            name: name.to_owned(),
            disabled: false,
            created_at: now_rfc3339(),
        };
        let row = user.clone();
        let inserted = self
            .write(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO users (id, name, disabled, created_at) VALUES (?, ?, 0, ?) \
                     ON CONFLICT (name) DO NOTHING",
                )
                .db()?
                .execute(params![row.id, row.name, row.created_at])
                .db()
            })
            .await?;
        if inserted == 0 {
            return Err(Error::UserExists(user.name));
        }
        Ok(user)
    }

    async fn list_users(&self) -> Result<Vec<User>> {
        self.read(|conn| {
            let sql = format!("SELECT {USER_COLUMNS} FROM users ORDER BY created_at, id");
            query_all(conn, &sql, [], decode_user)
        })
        .await
    }

    async fn find_user(&self, id_or_name: &str) -> Result<Option<User>> {
        let key = id_or_name.to_owned();
        self.read(move |conn| {
            // An id match wins over a name match.
            let sql = format!(
                "SELECT {USER_COLUMNS} FROM users WHERE id = ?1 OR name = ?1 \
                 ORDER BY id = ?1 DESC LIMIT 1"
            );
            let mut statement = conn.prepare_cached(&sql).db()?;
            let mut rows = statement.query([key]).db()?;
            rows.next().db()?.map(decode_user).transpose()
        })
        .await
    }

    async fn disable_user(&self, user_id: &str) -> Result<bool> {
        let user_id = user_id.to_owned();
        let updated = self
            .write(move |conn| {
                conn.prepare_cached("UPDATE users SET disabled = 1 WHERE id = ?")
                    .db()?
                    .execute([user_id])
                    .db()
            })
            .await?;
        Ok(updated > 0)
    }

    async fn create_token(&self, token: NewToken) -> Result<TokenRecord> {
        validate_new_token(&token)?;
        let record = token.to_record();
        let row = record.clone();
        let digest = token.digest;
        self.write(move |conn| {
            let tx: &Connection = conn;
            let user_exists = tx
                .prepare_cached("SELECT 1 FROM users WHERE id = ?")
                .db()?
                .query_row([&row.user_id], |_| Ok(()))
                .optional()
                .db()?
                .is_some();
            if !user_exists {
                return Err(Error::UnknownUser(row.user_id));
            }
            let inserted = tx
                .prepare_cached(
                    "INSERT INTO tokens (id, user_id, digest, name, permissions, created_at, \
                     expires_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING",
                )
                .db()?
                .execute(params![
                    row.id,
                    row.user_id,
                    digest,
                    row.name,
                    row.permissions.to_string(),
                    row.created_at,
                    row.expires_at
                ])
                .db()?;
            if inserted == 0 {
                return Err(Error::InvalidToken(
                    "the digest is already stored".to_owned(),
                ));
            }
            Ok(())
        })
        .await?;
        Ok(record)
    }

    async fn list_tokens(&self, user_id: Option<&str>) -> Result<Vec<TokenRecord>> {
        let user_id = user_id.map(str::to_owned);
        self.read(move |conn| {
            let sql = format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens t WHERE ?1 IS NULL OR t.user_id = ?1 \
                 ORDER BY t.created_at, t.id"
            );
            query_all(conn, &sql, [user_id], decode_token)
        })
        .await
    }

    async fn revoke_token(&self, token_id: &str) -> Result<bool> {
        let token_id = token_id.to_owned();
        let now = now_rfc3339();
        let updated = self
            .write(move |conn| {
                // The first revocation's time is kept; a repeat still reports the token.
                conn.prepare_cached(
                    "UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?",
                )
                .db()?
                .execute(params![now, token_id])
                .db()
            })
            .await?;
        Ok(updated > 0)
    }

    async fn find_token(&self, digest: &str) -> Result<Option<TokenOwner>> {
        let digest = digest.to_owned();
        self.read(move |conn| {
            let sql = format!(
                "SELECT {TOKEN_COLUMNS}, u.id, u.name, u.disabled, u.created_at \
                 FROM tokens t JOIN users u ON u.id = t.user_id WHERE t.digest = ?"
            );
            let mut statement = conn.prepare_cached(&sql).db()?;
            let mut rows = statement.query([digest]).db()?;
            let Some(row) = rows.next().db()? else {
                return Ok(None);
            };
            Ok(Some(TokenOwner {
                token: decode_token(row)?,
                user: User {
                    id: row.get(8).db()?,
                    name: row.get(9).db()?,
                    disabled: row.get(10).db()?,
                    created_at: row.get(11).db()?,
                },
            }))
        })
        .await
    }

    async fn touch_token(&self, token_id: &str) -> Result<()> {
        let token_id = token_id.to_owned();
        let now = now_rfc3339();
        self.write(move |conn| {
            conn.prepare_cached("UPDATE tokens SET last_used_at = ? WHERE id = ?")
                .db()?
                .execute(params![now, token_id])
                .db()
        })
        .await?;
        Ok(())
    }
}
