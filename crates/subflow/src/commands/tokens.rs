//! `subflow tokens create|list|revoke` (docs/api.md#auth-and-ownership). A token is `sf_` + 43 base64url
//! characters (32 bytes from the OS random source). `create` prints it once on stdout;
//! the database only ever holds its SHA-256 digest, and `list` shows metadata only.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::anyhow;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use subflow_contracts::auth::{TOKEN_PREFIX, token_digest};
use subflow_contracts::{Permission, Permissions};
use subflow_store::{NewToken, Store, TokenOwner, TokenRecord, User};
use time::OffsetDateTime;

use super::UsageError;
use super::admin::{AdminArgs, cell, store_error, table};
use super::users::find_user;

/// `subflow tokens …`.
#[derive(Debug, clap::Subcommand)]
pub enum TokensCommand {
    /// Create a token and print it on stdout. It is shown only this once.
    Create {
        /// The user's name or id.
        #[arg(long, value_name = "USER")]
        user: String,
        /// Comma-separated permissions: threads:read, threads:write, runs:read,
        /// runs:write, admin (admin implies all).
        #[arg(long = "perm", value_name = "PERMS")]
        permissions: String,
        /// Lifetime: a number and a unit, s, m, h, d or w (e.g. 30d). Default: never expires.
        #[arg(long, value_name = "DURATION")]
        expires: Option<String>,
        /// A label for people, e.g. `ci`.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// List tokens (never the tokens themselves: id, owner, permissions, dates, status).
    List {
        /// Only this user's tokens (name or id).
        #[arg(long, value_name = "USER")]
        user: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Revoke a token: it stops authenticating at once.
    Revoke {
        /// The token's id, as `subflow tokens list` shows it.
        id: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// A fresh token: `sf_` and 32 random bytes in base64url without padding.
fn generate_token() -> anyhow::Result<String> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret)
        .map_err(|error| anyhow!("the OS random source failed: {error}"))?;
    Ok(format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(secret)))
}

/// Reads `--perm`.
fn parse_permissions(text: &str) -> Result<Permissions, UsageError> {
    Permissions::parse_list(text).map_err(|error| {
        let known: Vec<&str> = Permission::ALL.iter().map(|p| p.as_str()).collect();
        UsageError(format!(
            "--perm: unknown permission '{}'; give a comma-separated list of {}",
            error.value,
            known.join(", ")
        ))
    })
}

/// Reads `--expires`: a positive whole number followed by s, m, h, d or w.
fn parse_lifetime(text: &str) -> Result<Duration, UsageError> {
    let invalid = || {
        UsageError(format!(
            "--expires: expected a positive number followed by s, m, h, d or w, such as 30d or 12h, got '{text}'"
        ))
    };
    let unit_at = text
        .char_indices()
        .last()
        .map(|(index, _)| index)
        .ok_or_else(invalid)?;
    let (count, unit) = text.split_at(unit_at);
    let seconds_per_unit: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(invalid()),
    };
    if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let count: u64 = count.parse().map_err(|_| invalid())?;
    let seconds = count
        .checked_mul(seconds_per_unit)
        .filter(|seconds| *seconds > 0)
        .ok_or_else(invalid)?;
    Ok(Duration::from_secs(seconds))
}

/// When a token created `now` with `lifetime` expires.
fn expiry(now: OffsetDateTime, lifetime: Duration) -> Result<OffsetDateTime, UsageError> {
    now.checked_add(
        time::Duration::try_from(lifetime)
            .map_err(|_| UsageError("--expires is too far in the future".to_owned()))?,
    )
    .filter(|at| at.year() <= 9999)
    .ok_or_else(|| UsageError("--expires is too far in the future".to_owned()))
}

/// What a token's status column says.
fn status(token: &TokenRecord, user: Option<&User>) -> &'static str {
    let Some(user) = user else {
        return "no user";
    };
    let owner = TokenOwner {
        token: token.clone(),
        user: user.clone(),
    };
    match owner.refusal(OffsetDateTime::now_utc()) {
        None => "active",
        Some(refusal) => refusal.as_str(),
    }
}

/// A token's metadata as `--json` prints it; the token itself is never part of it.
fn token_json(token: &TokenRecord, user: Option<&User>) -> Value {
    json!({
        "id": token.id, "user_id": token.user_id, "user": user.map(|u| &u.name),
        "name": token.name, "permissions": token.permissions.iter().map(Permission::as_str).collect::<Vec<_>>(),
        "created_at": token.created_at, "expires_at": token.expires_at,
        "last_used_at": token.last_used_at, "revoked_at": token.revoked_at,
        "status": status(token, user),
    })
}

/// Runs `subflow tokens …`.
pub async fn run(command: TokensCommand) -> anyhow::Result<()> {
    let admin = match &command {
        TokensCommand::Create { admin, .. }
        | TokensCommand::List { admin, .. }
        | TokensCommand::Revoke { admin, .. } => admin.clone(),
    };
    // Bad flags are reported before the database is touched.
    if let TokensCommand::Create {
        permissions,
        expires,
        ..
    } = &command
    {
        parse_permissions(permissions)?;
        if let Some(expires) = expires {
            parse_lifetime(expires)?;
        }
    }
    let database = admin.open().await?;
    let result = execute(command, &admin, &*database.store).await;
    database.close().await;
    result
}

async fn execute(
    command: TokensCommand,
    admin: &AdminArgs,
    store: &dyn Store,
) -> anyhow::Result<()> {
    match command {
        TokensCommand::Create {
            user,
            permissions,
            expires,
            name,
            ..
        } => {
            let permissions = parse_permissions(&permissions)?;
            let user = find_user(store, &user).await?;
            if user.disabled {
                return Err(UsageError(format!(
                    "user {} is disabled; its tokens would never authenticate",
                    user.name
                ))
                .into());
            }
            let expires_at = expires
                .as_deref()
                .map(|text| expiry(OffsetDateTime::now_utc(), parse_lifetime(text)?))
                .transpose()?;
            let token = generate_token()?;
            let record = store
                .create_token(NewToken {
                    user_id: user.id.clone(),
                    name,
                    permissions,
                    expires_at,
                    digest: token_digest(&token),
                })
                .await
                .map_err(store_error)?;
            let shown = if admin.json {
                let mut body = token_json(&record, Some(&user));
                body["token"] = json!(token);
                outln!("{body}")
            } else {
                outln!("{token}")
            };
            // Even a closed pipe is an error here: the token exists but nobody saw it.
            shown.map_err(|error| {
                anyhow::anyhow!(
                    "cannot print the new token ({error}); revoke it with `subflow tokens revoke {}`",
                    record.id
                )
            })?;
            eprintln!(
                "subflow: token {} for {} ({}), {}; it is shown only now, keep it secret",
                record.id,
                user.name,
                record.permissions,
                record
                    .expires_at
                    .as_deref()
                    .map_or("never expires".to_owned(), |at| format!("expires {at}")),
            );
        }
        TokensCommand::List { user, .. } => {
            let only = match user {
                Some(user) => Some(find_user(store, &user).await?),
                None => None,
            };
            let tokens = store
                .list_tokens(only.as_ref().map(|u| u.id.as_str()))
                .await
                .map_err(store_error)?;
            let users: HashMap<String, User> = store
                .list_users()
                .await
                .map_err(store_error)?
                .into_iter()
                .map(|u| (u.id.clone(), u))
                .collect();
            if admin.json {
                let listed = tokens.iter().map(|t| token_json(t, users.get(&t.user_id)));
                outln!("{}", Value::from_iter(listed))?;
            } else {
                let mut rows = vec![
                    [
                        "ID",
                        "USER",
                        "NAME",
                        "PERMISSIONS",
                        "CREATED_AT",
                        "EXPIRES_AT",
                        "LAST_USED_AT",
                        "STATUS",
                    ]
                    .map(str::to_owned)
                    .to_vec(),
                ];
                rows.extend(tokens.iter().map(|token| {
                    let user = users.get(&token.user_id);
                    vec![
                        token.id.clone(),
                        cell(user.map(|u| u.name.as_str())),
                        cell(token.name.as_deref()),
                        token.permissions.to_string(),
                        token.created_at.clone(),
                        cell(token.expires_at.as_deref()),
                        cell(token.last_used_at.as_deref()),
                        status(token, user).to_owned(),
                    ]
                }));
                out!("{}", table(&rows))?;
            }
        }
        TokensCommand::Revoke { id, .. } => {
            if !store.revoke_token(&id).await.map_err(store_error)? {
                return Err(UsageError(format!(
                    "no token has the id '{id}'; `subflow tokens list` shows them"
                ))
                .into());
            }
            eprintln!("subflow: revoked token {id}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use subflow_contracts::auth::is_well_formed_token;

    #[test]
    fn tokens_are_the_prefix_and_43_base64url_characters_and_never_repeat() {
        let first = generate_token().unwrap();
        let second = generate_token().unwrap();
        assert!(is_well_formed_token(&first), "{first}");
        assert_eq!(first.len(), 3 + 43);
        assert_ne!(first, second);
    }

    #[test]
    fn lifetimes_are_a_number_and_a_unit() {
        assert_eq!(
            parse_lifetime("30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
        assert_eq!(
            parse_lifetime("12h").unwrap(),
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(parse_lifetime("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_lifetime("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(
            parse_lifetime("2w").unwrap(),
            Duration::from_secs(14 * 86_400)
        );
        for bad in [
            "",
            "d",
            "30",
            "0d",
            "-1d",
            "1.5d",
            "30 d",
            "30y",
            "30D",
            "١d",
            "99999999999999999999d",
        ] {
            let error = parse_lifetime(bad).unwrap_err();
            assert!(
                error.0.starts_with("--expires: expected"),
                "{bad}: {}",
                error.0
            );
        }
        let now = OffsetDateTime::now_utc();
        assert!(expiry(now, parse_lifetime("1d").unwrap()).unwrap() > now);
        let far = parse_lifetime(&format!("{}w", u64::MAX / (7 * 86_400))).unwrap();
        assert!(expiry(now, far).is_err());
    }

    #[test]
    fn permissions_name_the_unknown_one_and_the_known_ones() {
        assert_eq!(
            parse_permissions("runs:read,runs:write")
                .unwrap()
                .to_string(),
            "runs:read,runs:write"
        );
        let error = parse_permissions("runs:read,runs:delete").unwrap_err();
        assert_eq!(
            error.0,
            "--perm: unknown permission 'runs:delete'; give a comma-separated list of \
             threads:read, threads:write, runs:read, runs:write, admin"
        );
    }
}
