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
    pub fn as_str(self) -> &'static str {
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
    fn unmapped_is_no_code_or_internal_error() {
        assert!(is_unmapped(None) && is_unmapped(Some("")) && is_unmapped(Some("internal_error")));
        assert!(!is_unmapped(Some("timeout")) && !is_unmapped(Some("INTERNAL_ERROR_X")));
        assert_eq!(
            unmapped_sql("error_code"),
            "coalesce(error_code, '') IN ('', 'internal_error')"
        );
    }
}
