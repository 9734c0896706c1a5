//! The store's error type.

/// What can go wrong in a store call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A thread id outside `^[A-Za-z0-9_-]{1,64}$`.
    #[error(transparent)]
    InvalidThreadId(#[from] subflow_contracts::InvalidThreadId),
    /// An `event_type` outside 1–32 characters, or a malformed `middleware:` type.
    #[error(
        "invalid event_type '{0}': expected 1-32 characters (middleware types: 12-32 with a 1-21 character tag)"
    )]
    InvalidEventType(String),
    /// A `category` outside 1–16 characters.
    #[error("invalid category '{0}': expected 1-16 characters")]
    InvalidCategory(String),
    /// An empty `run_id`.
    #[error("invalid run_id: it must not be empty")]
    InvalidRunId,
    /// A batch holding events of more than one thread.
    #[error("a batch must not mix threads: found '{first}' and '{other}'")]
    MixedThreads {
        /// The batch's first thread.
        first: String,
        /// Another thread in the same batch.
        other: String,
    },
    /// A query outside its bounds.
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// A thread that already exists.
    #[error("Thread {0} already exists")]
    ThreadExists(String),
    /// A run id that already exists.
    #[error("Run {0} already exists")]
    RunExists(String),
    /// A run id that names no run (of the given thread).
    #[error("Run {0} not found")]
    RunNotFound(String),
    /// Stream frames that cannot be appended: bad ids or event names, or a hole in the log.
    #[error("invalid stream frames: {0}")]
    InvalidFrame(String),
    /// A fenced write whose writer no longer holds the run's lease: another process
    /// recovered the run. Nothing was written.
    #[error("the lease of run {0} is no longer this process's: another process recovered the run")]
    LeaseLost(String),
    /// A user name outside 1–64 characters from `A-Z a-z 0-9 . _ @ -`.
    #[error(
        "invalid user name '{0}': expected 1-64 characters from A-Z, a-z, 0-9, '.', '_', '@' and '-'"
    )]
    InvalidUserName(String),
    /// A user name that is already taken.
    #[error("user '{0}' already exists")]
    UserExists(String),
    /// A user id that names no user.
    #[error("no user with id '{0}'")]
    UnknownUser(String),
    /// A token that cannot be stored.
    #[error("invalid token: {0}")]
    InvalidToken(String),
    /// A batch that cannot be submitted; the text says what to fix.
    #[error("{0}")]
    InvalidBatch(String),
    /// A stored value that does not decode.
    #[error("corrupt stored value in {what}: {detail}")]
    Corrupt {
        /// The column or record.
        what: &'static str,
        /// Why it does not decode.
        detail: String,
    },
    /// The backend failed (connection, IO, constraint).
    #[error("storage backend error: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// Wraps a backend error.
    pub fn backend(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::Backend(Box::new(error))
    }

    /// Whether the call failed because of its input (nothing was written) rather than the backend.
    pub fn is_invalid_input(&self) -> bool {
        !matches!(self, Error::Backend(_) | Error::Corrupt { .. })
    }
}

/// Result with the store's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
