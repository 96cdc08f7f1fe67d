//! Incremental detokenization for streaming, with vLLM/TGI's two offsets.
//!
//! Decoding one token at a time is wrong: a multi-byte character can be split across
//! byte-level tokens, and some decoders treat a token differently at the start of a text. So
//! each step decodes a short window `ids[prefix_offset..]` and compares it with the window's
//! already-emitted part `ids[prefix_offset..read_offset]`: the difference is the new text, held
//! back while it ends in an incomplete character (U+FFFD). Window starts are always at character
//! boundaries, so the deltas concatenate to `decode(all ids)`.
//!
//! The detokenizer borrows the tokenizer per call instead of holding it, so a sequence can own
//! its detokenizer next to a shared tokenizer.

use crate::tokenizer::{Tokenizer, TokenizerError};

const REPLACEMENT: char = '\u{FFFD}';

/// Streaming detokenizer state of one sequence.
#[derive(Clone, Debug, Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    /// Start of the decode window (a character boundary).
    prefix_offset: usize,
    /// End of the text already emitted.
    read_offset: usize,
    skip_special: bool,
}

impl Detokenizer {
    /// A detokenizer for generated ids; `skip_special` leaves special tokens out of the text.
    pub fn new(skip_special: bool) -> Self {
        Detokenizer { skip_special, ..Default::default() }
    }

    /// Starts after `context` ids (e.g. the last few prompt tokens) whose text is not emitted
    /// but decides how the first generated token decodes (leading spaces).
    pub fn with_context(context: &[u32], skip_special: bool) -> Self {
        Detokenizer {
            ids: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
            skip_special,
        }
    }

    /// Feed one id; returns the text it completes (often empty while a character is split).
    pub fn step(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let (prefix_text, new_text) = self.window(tok)?;
        if new_text.len() > prefix_text.len() && !new_text.ends_with(REPLACEMENT) {
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(delta(&prefix_text, &new_text))
        } else {
            Ok(String::new())
        }
    }

    /// Emit whatever is held back (an incomplete character at the very end becomes U+FFFD, as
    /// in `decode`). After this the emitted text equals `decode(all ids)`.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String, TokenizerError> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let (prefix_text, new_text) = self.window(tok)?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(delta(&prefix_text, &new_text))
    }

    /// Every id fed so far, context included.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// (text of the emitted part of the window, text of the whole window)
    fn window(&self, tok: &Tokenizer) -> Result<(String, String), TokenizerError> {
        let prefix = &self.ids[self.prefix_offset..self.read_offset];
        let prefix_text = tok.decode(prefix, self.skip_special)?;
        let new_text = tok.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        Ok((prefix_text, new_text))
    }
}

/// `new_text` minus its leading `prefix_text`. Should a decoder rewrite the shared start (it
/// does not for byte-level BPE), fall back to cutting at the nearest character boundary.
fn delta(prefix_text: &str, new_text: &str) -> String {
    if let Some(rest) = new_text.strip_prefix(prefix_text) {
        return rest.to_string();
    }
    let mut cut = prefix_text.len().min(new_text.len());
    while !new_text.is_char_boundary(cut) {
        cut += 1;
    }
    new_text[cut..].to_string()
}

#[cfg(test)]
mod tests {
    use super::delta;

    #[test]
    fn delta_strips_the_prefix_and_respects_char_boundaries() {
        assert_eq!(delta("ab", "abcd"), "cd");
        assert_eq!(delta("", "é"), "é");
        // Rewritten start: cut at the first boundary at or after the prefix length.
        assert_eq!(delta("x", "éz"), "z");
    }
}
