//! The output side of generation: incremental detokenization ([`Detokenizer`]), stop
//! conditions and finish reasons ([`OutputStream`]), reasoning split from the answer
//! ([`ReasoningParser`]), tool calls found in it ([`ToolCallParser`]), gpt-oss's harmony channels
//! ([`HarmonyParser`]), the three put together for a chat answer ([`AnswerParser`]). Imports the
//! tokenizer only.

mod answer;
mod detokenizer;
mod harmony;
mod reasoning;
mod stop;
mod tool_calls;

pub use answer::AnswerParser;
pub use detokenizer::Detokenizer;
pub use harmony::{
    template_is_harmony, HarmonyParser, CHANNEL as HARMONY_CHANNEL, CONSTRAIN as HARMONY_CONSTRAIN,
    MESSAGE as HARMONY_MESSAGE,
};
pub use reasoning::{
    prompt_closes_reasoning, prompt_opens_reasoning, template_reasons, ReasoningParser, Split,
    THINK_END, THINK_START,
};
pub use stop::{FinishReason, OutputDelta, OutputStream, StopCondition};
pub use tool_calls::{
    ToolCall, ToolCallFormat, ToolCallParser, CLOSE as TOOL_CALL_CLOSE, MISTRAL_ARGS,
    MISTRAL_CALLS, OPEN as TOOL_CALL_OPEN, PYTHON_TAG,
};
