//! Log lines on stderr in the formats of docs/operations.md#logging. The trace id comes from the
//! `trace_id` field of the enclosing span (the gateway opens one per request and per run).

use std::fmt;

use serde_json::json;
use time::OffsetDateTime;
use time::macros::format_description;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::{LogFormat, LoggingConfig};

/// The line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    /// `{time} - {target} - {LEVEL} - {message}`.
    Plain,
    /// `{time} - {target} - {LEVEL} - [trace_id={id or -}] - {message}`.
    Text,
    /// `{timestamp, logger, level, trace_id, message}` per line.
    Json,
}

impl LineFormat {
    /// The format `logging.enhance.*` asks for.
    pub fn of(config: &LoggingConfig) -> Self {
        match (config.enhance.enabled, config.enhance.format) {
            (false, _) => LineFormat::Plain,
            (true, LogFormat::Text) => LineFormat::Text,
            (true, LogFormat::Json) => LineFormat::Json,
        }
    }
}

/// PostgreSQL's notices (such as "relation … already exists, skipping" at every start)
/// reach the log only as warnings, unless `level` names their target itself.
const QUIET_NOTICES: &str = "sqlx::postgres::notice=warn";

/// Installs the global subscriber: `$SUBFLOW_LOG` (an env-filter) wins over `level`.
pub fn init(level: &str, format: LineFormat) {
    let directives = if level.contains("sqlx::postgres::notice") {
        level.to_owned()
    } else {
        format!("{level},{QUIET_NOTICES}")
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SUBFLOW_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(directives))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Plain span fields: the formats below read `trace_id=` from them.
        .with_ansi(false)
        .with_env_filter(filter)
        .event_format(Lines { format })
        .try_init();
}

struct Lines {
    format: LineFormat,
}

/// Collects the message and the other fields of an event.
#[derive(Default)]
struct Message {
    text: String,
    fields: String,
}

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.text = format!("{value:?}");
        } else {
            self.fields
                .push_str(&format!(" {}={value:?}", field.name()));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.text = value.to_owned();
        } else {
            self.fields.push_str(&format!(" {}={value}", field.name()));
        }
    }
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let time = OffsetDateTime::now_utc()
            .format(format_description!(
                "[year]-[month]-[day] [hour]:[minute]:[second]"
            ))
            .map_err(|_| fmt::Error)?;
        let metadata = event.metadata();
        let mut message = Message::default();
        event.record(&mut message);
        let text = format!("{}{}", message.text, message.fields);
        let trace_id = ctx.event_scope().and_then(|scope| {
            scope
                .from_root()
                .filter_map(|span| {
                    let extensions = span.extensions();
                    let fields = extensions.get::<FormattedFields<N>>()?;
                    let start = fields.fields.find("trace_id=")? + "trace_id=".len();
                    Some(
                        fields.fields[start..]
                            .split_whitespace()
                            .next()
                            .unwrap_or_default()
                            .trim_matches('"')
                            .to_owned(),
                    )
                })
                .last()
        });
        match self.format {
            LineFormat::Plain => writeln!(
                writer,
                "{time} - {} - {} - {text}",
                metadata.target(),
                metadata.level()
            ),
            LineFormat::Text => writeln!(
                writer,
                "{time} - {} - {} - [trace_id={}] - {text}",
                metadata.target(),
                metadata.level(),
                trace_id.as_deref().unwrap_or("-")
            ),
            LineFormat::Json => writeln!(
                writer,
                "{}",
                json!({"timestamp": time, "logger": metadata.target(), "level": metadata.level().as_str(), "trace_id": trace_id, "message": text})
            ),
        }
    }
}
