-- Users and API tokens (docs/api.md#auth-and-ownership). A token is stored only as the lowercase hex
-- SHA-256 of its text (`digest`); the token itself is shown once and never stored.
-- `permissions` is the comma-separated list `Permissions` prints. Listings are in
-- creation order: `created_at`, then the id (a UUID v7) for ties within a microsecond.

CREATE TABLE users (
    id         TEXT PRIMARY KEY NOT NULL,
    name       TEXT NOT NULL UNIQUE,
    disabled   INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL
);

CREATE TABLE tokens (
    id           TEXT PRIMARY KEY NOT NULL,
    user_id      TEXT NOT NULL REFERENCES users (id),
    digest       TEXT NOT NULL UNIQUE,
    name         TEXT,
    permissions  TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    expires_at   TEXT,
    last_used_at TEXT,
    revoked_at   TEXT
);
CREATE INDEX tokens_by_user ON tokens (user_id, created_at);
