//! [`ReasoningParser`]: splits a reasoning model's output into its reasoning (between `<think>`
//! and `</think>`, as Qwen3, Qwen3.5 and DeepSeek-R1 write it) and its answer, as text streams
//! in (OpenAI-compatible servers return the first as `reasoning_content`). A tag split across
//! deltas is held back until it is whole; nothing else waits.

/// Opens the reasoning.
pub const THINK_START: &str = "<think>";
/// Closes it.
pub const THINK_END: &str = "</think>";

/// Whether a chat template writes reasoning blocks (its text names the closing tag): the server
/// then splits its model's answers.
pub fn template_reasons(template_source: &str) -> bool {
    template_source.contains(THINK_END)
}

/// Whether a rendered chat prompt leaves a reasoning block open for the model (Qwen3.5's and
/// DeepSeek-R1's generation prompts end with `<think>`): the output then starts inside it.
pub fn prompt_opens_reasoning(prompt: &str) -> bool {
    prompt.trim_end().ends_with(THINK_START)
}

/// Whether a rendered chat prompt ends with a closed reasoning block (Qwen3's and
/// DeepSeek-V3.1's generation prompts with thinking off write an empty one): the model answers
/// at once.
pub fn prompt_closes_reasoning(prompt: &str) -> bool {
    prompt.trim_end().ends_with(THINK_END)
}

/// Where the parser is in the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace yet: a `<think>` may still open the reasoning.
    Start,
    /// Inside the reasoning; its leading newlines not yet passed.
    ReasoningStart,
    Reasoning,
    /// After `</think>`; its leading newlines not yet passed.
    AnswerStart,
    Answer,
}

/// A piece of output, split.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// The incremental splitter; see the module docs. The reasoning loses the newlines next to its
/// tags, the answer its leading newlines (as the templates that re-render them trim them).
#[derive(Clone, Debug)]
pub struct ReasoningParser {
    phase: Phase,
    /// Text that may be the start of a tag (or newlines before a closing tag): not yet said.
    held: String,
}

impl ReasoningParser {
    /// A parser for an output that starts inside a reasoning block (`in_reasoning`: the prompt
    /// opened it) or that may open one.
    pub fn new(in_reasoning: bool) -> Self {
        let phase = if in_reasoning { Phase::ReasoningStart } else { Phase::Start };
        ReasoningParser { phase, held: String::new() }
    }

    /// Splits the next piece of output.
    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        let mut rest = std::mem::take(&mut self.held) + text;
        loop {
            match self.phase {
                Phase::Start => {
                    let trimmed = rest.trim_start();
                    if let Some(after) = trimmed.strip_prefix(THINK_START) {
                        rest = after.to_string();
                        self.phase = Phase::ReasoningStart;
                    } else if THINK_START.starts_with(trimmed) {
                        self.held = rest; // whitespace, or a partial `<think>`
                        return out;
                    } else {
                        self.phase = Phase::Answer;
                    }
                }
                Phase::ReasoningStart | Phase::AnswerStart => {
                    let trimmed = rest.trim_start_matches('\n');
                    if trimmed.is_empty() {
                        return out; // only newlines so far: dropped
                    }
                    rest = trimmed.to_string();
                    self.phase = match self.phase {
                        Phase::ReasoningStart => Phase::Reasoning,
                        _ => Phase::Answer,
                    };
                }
                Phase::Reasoning => match rest.find(THINK_END) {
                    Some(i) => {
                        out.reasoning.push_str(rest[..i].trim_end_matches('\n'));
                        rest = rest[i + THINK_END.len()..].to_string();
                        self.phase = Phase::AnswerStart;
                    }
                    None => {
                        let keep = held_suffix(&rest);
                        out.reasoning.push_str(&rest[..rest.len() - keep]);
                        self.held = rest[rest.len() - keep..].to_string();
                        return out;
                    }
                },
                Phase::Answer => {
                    out.content.push_str(&rest);
                    return out;
                }
            }
        }
    }

    /// The end of the output: what was held back goes where it belongs (an unclosed reasoning
    /// keeps its text; a lone partial `<think>` is answer text).
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.phase {
            Phase::Start => Split { content: held, ..Split::default() },
            Phase::Reasoning => {
                Split { reasoning: held.trim_end_matches('\n').to_string(), ..Split::default() }
            }
            _ => Split::default(),
        }
    }
}

/// Bytes at the end of `text` that may begin `\n*</think>`: trailing newlines, then a proper
/// prefix of the closing tag.
fn held_suffix(text: &str) -> usize {
    let tag = (1..THINK_END.len()).rev().find(|&n| text.ends_with(&THINK_END[..n])).unwrap_or(0);
    let before = &text[..text.len() - tag];
    tag + (before.len() - before.trim_end_matches('\n').len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` one by one and joins the splits.
    fn run(in_reasoning: bool, pieces: &[&str]) -> (String, String) {
        let mut p = ReasoningParser::new(in_reasoning);
        let (mut r, mut c) = (String::new(), String::new());
        for piece in pieces {
            let s = p.push(piece);
            r += &s.reasoning;
            c += &s.content;
        }
        let s = p.finish();
        (r + &s.reasoning, c + &s.content)
    }

    fn both(r: &str, c: &str) -> (String, String) {
        (r.to_string(), c.to_string())
    }

    #[test]
    fn splits_a_think_block_however_the_text_is_cut() {
        let text = "<think>\nAdd them: 2 + 2.\n</think>\n\n4, of course.";
        let want = both("Add them: 2 + 2.", "4, of course.");
        assert_eq!(run(false, &[text]), want);
        // every split point, and one character at a time
        for i in 0..=text.len() {
            assert_eq!(run(false, &[&text[..i], &text[i..]]), want, "cut at {i}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(false, &pieces), want);
    }

    #[test]
    fn a_prompt_that_opens_the_block_starts_in_reasoning() {
        assert!(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert_eq!(run(true, &["Hmm.\n", "</th", "ink>\n\nYes."]), both("Hmm.", "Yes."));
    }

    #[test]
    fn answers_without_reasoning_and_unclosed_reasoning() {
        assert_eq!(run(false, &["Just ", "an answer."]), both("", "Just an answer."));
        assert_eq!(run(false, &["<thi"]), both("", "<thi"), "a lone partial tag is answer text");
        assert_eq!(run(false, &["<b>bold</b>"]), both("", "<b>bold</b>"));
        assert_eq!(run(true, &["still thinking\n", "</"]), both("still thinking\n</", ""));
        assert_eq!(run(true, &["x < y and a </b> tag"]), both("x < y and a </b> tag", ""));
        // a second <think> inside the answer stays in the answer
        assert_eq!(run(false, &["<think>a</think>b<think>c"]), both("a", "b<think>c"));
        assert!(template_reasons("{{ '<think>' }}…{{ '</think>' }}"));
        assert!(!template_reasons("{{ messages }}"));
    }
}
