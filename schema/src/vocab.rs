//! The classification vocabulary (every span has a stage; a failed one an error type): the values of the `stage` and `error_type`
//! columns. Every crate uses these enums; `toolspan-pipeline` decides them.

/// The stage of a span in a tool call's life, or what else it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// An agent run (the root of a trace, or `invoke_agent`).
    Agent,
    /// A model call.
    Llm,
    /// A logical tool call.
    Call,
    /// One attempt of a tool call.
    Attempt,
    /// Preparing the tool's arguments.
    Prepare,
    /// Reaching the tool (network).
    Send,
    /// The tool's own work.
    Execute,
    /// Parsing the tool's answer.
    Parse,
    /// Anything else.
    Other,
}

impl Stage {
    /// Every stage, in a stable order.
    pub const ALL: [Stage; 9] = [
        Stage::Agent,
        Stage::Llm,
        Stage::Call,
        Stage::Attempt,
        Stage::Prepare,
        Stage::Send,
        Stage::Execute,
        Stage::Parse,
        Stage::Other,
    ];

    /// The column value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Agent => "agent",
            Stage::Llm => "llm",
            Stage::Call => "call",
            Stage::Attempt => "attempt",
            Stage::Prepare => "prepare",
            Stage::Send => "send",
            Stage::Execute => "execute",
            Stage::Parse => "parse",
            Stage::Other => "other",
        }
    }

    /// Parses a column value (case-insensitive).
    pub fn parse(s: &str) -> Option<Stage> {
        Stage::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
    }

    /// The stages of a tool call's life: the call, its attempts and the four stages. Tool
    /// metrics and the failure-rate rollup count these (agent runs, model calls and `other`
    /// are not a tool's).
    pub const TOOL: [Stage; 6] = [
        Stage::Call,
        Stage::Attempt,
        Stage::Prepare,
        Stage::Send,
        Stage::Execute,
        Stage::Parse,
    ];

    /// The column values of [`Stage::TOOL`], in that order.
    pub const TOOL_NAMES: [&'static str; 6] = names(Stage::TOOL);

    /// The four stages of a tool call's work, where a call's failure happens (each implies
    /// an error type, [`Stage::implied_error`]): prepare, send, execute, parse.
    pub const WORK: [Stage; 4] = [Stage::Prepare, Stage::Send, Stage::Execute, Stage::Parse];

    /// The column values of [`Stage::WORK`], in that order.
    pub const WORK_NAMES: [&'static str; 4] = names(Stage::WORK);

    /// Whether this is one of [`Stage::WORK`].
    pub fn is_work_stage(self) -> bool {
        Stage::WORK.contains(&self)
    }

    /// Whether this is one of [`Stage::TOOL`].
    pub fn is_tool_stage(self) -> bool {
        Stage::TOOL.contains(&self)
    }

    /// The error type a failed span of this stage gets by derivation, for the four stages
    /// that imply one.
    pub fn implied_error(self) -> Option<ErrorType> {
        match self {
            Stage::Prepare => Some(ErrorType::Prepare),
            Stage::Send => Some(ErrorType::Network),
            Stage::Execute => Some(ErrorType::ToolError),
            Stage::Parse => Some(ErrorType::Parse),
            _ => None,
        }
    }
}

/// The column values of `stages`, at compile time.
const fn names<const N: usize>(stages: [Stage; N]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = stages[i].as_str();
        i += 1;
    }
    out
}

/// Where a tool call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorType {
    /// Preparing arguments failed.
    Prepare,
    /// The tool could not be reached.
    Network,
    /// The tool failed (timeouts included).
    ToolError,
    /// The tool's answer could not be parsed.
    Parse,
    /// Every attempt of a retried call failed.
    RetryExhausted,
}

impl ErrorType {
    /// Every error type.
    pub const ALL: [ErrorType; 5] = [
        ErrorType::Prepare,
        ErrorType::Network,
        ErrorType::ToolError,
        ErrorType::Parse,
        ErrorType::RetryExhausted,
    ];

    /// The column value.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::Prepare => "PREPARE",
            ErrorType::Network => "NETWORK",
            ErrorType::ToolError => "TOOL_ERROR",
            ErrorType::Parse => "PARSE",
            ErrorType::RetryExhausted => "RETRY_EXHAUSTED",
        }
    }

    /// Parses one of the five values in any case: for what a person types (search filters,
    /// rules files).
    pub fn parse(s: &str) -> Option<ErrorType> {
        ErrorType::ALL
            .into_iter()
            .find(|e| e.as_str().eq_ignore_ascii_case(s))
    }

    /// Parses one of the five values exactly as the span conventions write them (upper case): for a
    /// span's `error.type`. Other instrumentation puts its own vocabulary there (the MCP SDK
    /// writes `tool_error` for any error result, whatever went wrong), which is a signal for
    /// the rules, not an explicit toolspan error type.
    pub fn parse_exact(s: &str) -> Option<ErrorType> {
        ErrorType::ALL.into_iter().find(|e| e.as_str() == s)
    }
}

/// A span's outcome: the values of the `status` column. A span or call **failed** when its
/// status is [`Status::Error`]: the one definition every reader uses (SQL through
/// [`failed_sql`]). The pipeline writes `error` for an OpenTelemetry error status and for a
/// failure it inferred (a result body that says it failed, another instrumentation's failed
/// span of the same call), so a row with an error type always has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// The span set status OK.
    Ok,
    /// The span failed.
    Error,
    /// The span set no status.
    Unset,
}

impl Status {
    /// The status of a span whose OpenTelemetry status code is `code` (0 unset, 1 ok, 2
    /// error); `inferred_failure`: the pipeline found it failed whatever its code says.
    pub fn of(code: i32, inferred_failure: bool) -> Status {
        match code {
            _ if inferred_failure => Status::Error,
            1 => Status::Ok,
            2 => Status::Error,
            _ => Status::Unset,
        }
    }

    /// The column value.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Unset => "unset",
        }
    }

    /// Whether a `status` column value means failed.
    pub fn is_failed(value: &str) -> bool {
        value == Status::Error.as_str()
    }
}

/// [`Status::is_failed`] as a SQL predicate over the status column `column` (e.g. `status`,
/// `c.status`).
pub fn failed_sql(column: &str) -> String {
    format!("{column} = 'error'")
}

/// [`failed_sql`] over the column `status` without a table alias, for statements written as
/// one string.
pub const FAILED_SQL: &str = "status = 'error'";

/// [`Stage::WORK`] (prepare, send, execute, parse) as a SQL list, for `stage IN (…)`.
pub const TOOL_STAGES_SQL: &str = "'prepare', 'send', 'execute', 'parse'";

/// The error code of a failure no named case caught: what the SDK answers for an exception it
/// has no case for.
pub const UNMAPPED_CODE: &str = "internal_error";

/// Whether a failure's error code leaves it **unmapped**: no named case caught it, so the
/// model cannot tell it from any other. That is the code [`UNMAPPED_CODE`], or no code at all
/// (absent or empty). The one definition: the metrics, the views (through [`unmapped_sql`]),
/// `compare`, the dashboards and the docs all count this.
pub fn is_unmapped(error_code: Option<&str>) -> bool {
    matches!(error_code, None | Some("")) || error_code == Some(UNMAPPED_CODE)
}

/// [`is_unmapped`] as a SQL predicate over the error-code column `column` (valid in
/// DataFusion and DuckDB).
pub fn unmapped_sql(column: &str) -> String {
    format!("coalesce({column}, '') IN ('', '{UNMAPPED_CODE}')")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Stage::ALL {
            assert_eq!(Stage::parse(s.as_str()), Some(s));
        }
        for e in ErrorType::ALL {
            assert_eq!(ErrorType::parse(e.as_str()), Some(e));
        }
        assert_eq!(ErrorType::parse("java.net.ConnectException"), None);
        assert_eq!(ErrorType::parse("tool_error"), Some(ErrorType::ToolError));
        assert_eq!(
            ErrorType::parse_exact("TOOL_ERROR"),
            Some(ErrorType::ToolError)
        );
        assert_eq!(ErrorType::parse_exact("tool_error"), None);
        assert_eq!(Stage::Send.implied_error(), Some(ErrorType::Network));
        assert_eq!(Stage::Call.implied_error(), None);
        assert!(Stage::Parse.is_tool_stage() && !Stage::Llm.is_tool_stage());
    }

    #[test]
    fn failed_is_the_error_status() {
        assert_eq!(Status::of(2, false), Status::Error);
        assert_eq!(Status::of(1, true), Status::Error);
        assert_eq!(Status::of(0, false).as_str(), "unset");
        assert!(Status::is_failed("error") && !Status::is_failed("ok"));
        assert_eq!(
            failed_sql("c.status"),
            format!("c.status = '{}'", Status::Error.as_str())
        );
        assert_eq!(FAILED_SQL, failed_sql("status"));
        let work: Vec<String> = Stage::ALL
            .into_iter()
            .filter(|s| s.is_tool_stage() && *s != Stage::Call && *s != Stage::Attempt)
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        assert_eq!(TOOL_STAGES_SQL, work.join(", "));
        assert!(Stage::WORK.iter().all(|s| s.implied_error().is_some()));
        assert_eq!(
            Stage::WORK_NAMES.map(|s| format!("'{s}'")).join(", "),
            TOOL_STAGES_SQL
        );
        assert_eq!(Stage::TOOL_NAMES, Stage::TOOL.map(Stage::as_str));
    }

    #[test]
    fn unmapped_is_no_code_or_internal_error() {
        assert!(is_unmapped(None) && is_unmapped(Some("")) && is_unmapped(Some("internal_error")));
        assert!(!is_unmapped(Some("timeout")) && !is_unmapped(Some("INTERNAL_ERROR_X")));
        assert_eq!(
            unmapped_sql("error_code"),
            "coalesce(error_code, '') IN ('', 'internal_error')"
        );
    }
}
