//! Seeded, tokenized workloads: English-ish text cut to an exact number of tokens, and the
//! multi-turn chat of `kvrun bench multiturn` built at the token level, so that each turn's
//! prompt extends the previous prompt and its reply token for token (what a chat client that
//! keeps token ids sends, and what the prefix cache can reuse).
//!
//! A conversation of user `i` (token ids, `+` = concatenation):
//!
//! ```text
//! prompt(i, 1) = system + message(i, 1)
//! prompt(i, k) = prompt(i, k−1) + reply(i, k−1) + message(i, k)
//! ```
//!
//! `system` has exactly `system_tokens` tokens and is the same for every user; `message(i, k)`
//! has exactly `u(i, k)` tokens, drawn uniformly from the configured range. With a chat template
//! ([`Framing::ChatTemplate`]) the segments carry the template's role headers (`system` starts
//! with the template's opening and ends with the first user header; a message ends with the
//! assistant header, and from turn 2 on starts with the end of the previous reply's turn); the
//! headers count towards the exact lengths. [`Framing::Raw`] concatenates the texts alone.

use crate::tokenizer::{ChatMessage, ChatTemplate, Tokenizer, TokenizerError};

/// SplitMix64: a tiny seeded generator whose sequence never changes across crate versions.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// A generator for the stream named by `parts` under `seed` (e.g. `[user, turn]`).
    pub fn derive(seed: u64, parts: &[u64]) -> Self {
        let mut g = SplitMix64(seed ^ 0x6b76_7275_6e00_0000);
        for &p in parts {
            g = SplitMix64(g.next_u64() ^ p.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        g
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (`lo ≤ hi`).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
}

const WORDS: &[&str] = &[
    "the",
    "a",
    "river",
    "city",
    "market",
    "old",
    "new",
    "small",
    "large",
    "quiet",
    "bright",
    "morning",
    "evening",
    "traveler",
    "merchant",
    "teacher",
    "child",
    "garden",
    "bridge",
    "road",
    "house",
    "window",
    "letter",
    "story",
    "question",
    "answer",
    "reason",
    "music",
    "color",
    "winter",
    "summer",
    "journey",
    "friend",
    "village",
    "mountain",
    "forest",
    "harbor",
    "ship",
    "lamp",
    "book",
    "table",
    "bread",
    "water",
    "stone",
    "cloud",
    "wind",
    "fire",
    "light",
    "shadow",
    "walks",
    "writes",
    "reads",
    "finds",
    "builds",
    "carries",
    "remembers",
    "explains",
    "asks",
    "watches",
    "opens",
    "closes",
    "follows",
    "brings",
    "keeps",
    "shows",
    "learns",
    "sings",
    "slowly",
    "quickly",
    "often",
    "never",
    "always",
    "together",
    "again",
    "carefully",
    "today",
    "under",
    "over",
    "near",
    "behind",
    "across",
    "through",
    "toward",
    "beside",
    "before",
    "after",
    "and",
    "but",
    "because",
    "while",
    "when",
    "where",
    "with",
    "without",
    "from",
    "into",
    "about",
    "every",
    "some",
    "many",
    "few",
    "another",
    "their",
    "our",
    "its",
    "this",
    "that",
    "those",
    "green",
    "blue",
    "golden",
    "silver",
    "wooden",
    "narrow",
    "distant",
    "familiar",
    "curious",
];

/// Seeded English-ish text: sentences of 5–14 words from a fixed word list, about `num_words`
/// words in all (whole sentences).
pub fn english_text(rng: &mut SplitMix64, num_words: usize) -> String {
    let mut text = String::new();
    let mut words = 0;
    while words < num_words.max(1) {
        let len = rng.range(5, 14);
        for w in 0..len {
            let word = WORDS[rng.range(0, WORDS.len() - 1)];
            if w == 0 {
                if !text.is_empty() {
                    text.push(' ');
                }
                let mut chars = word.chars();
                text.extend(chars.next().map(|c| c.to_ascii_uppercase()));
                text.push_str(chars.as_str());
            } else {
                text.push(' ');
                text.push_str(word);
            }
        }
        text.push('.');
        words += len;
    }
    text
}

/// Exactly `n` token ids of seeded English-ish text (no special tokens): the tokenization of a
/// long enough text, cut after `n` ids. Deterministic for a tokenizer and a generator state.
pub fn exact_tokens(
    tok: &Tokenizer,
    rng: &mut SplitMix64,
    n: usize,
) -> Result<Vec<u32>, TokenizerError> {
    let mut num_words = n.max(8);
    loop {
        let mut attempt = rng.clone();
        let ids = tok.encode(&english_text(&mut attempt, num_words), false)?;
        if ids.len() >= n {
            *rng = attempt;
            return Ok(ids[..n].to_vec());
        }
        num_words *= 2;
    }
}

/// How the segments of a conversation are framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Framing {
    /// Role headers from the model's chat template, tokenized per segment.
    ChatTemplate,
    /// The texts alone, concatenated (BOS first when the tokenizer adds one).
    Raw,
}

/// Token ids around the texts of a conversation (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentFrames {
    /// Before the system text (BOS included when the tokenizer adds one).
    pub system_open: Vec<u32>,
    /// After the system text: its end and the first user header.
    pub system_close: Vec<u32>,
    /// Before a user text from turn 2 on: the end of the reply's turn and the user header.
    pub user_open: Vec<u32>,
    /// After a user text: its end and the assistant header (the generation prompt).
    pub user_close: Vec<u32>,
}

/// Marker texts rendered in place of message contents to find the template's frames.
const MARKERS: [&str; 4] = ["\u{E000}", "\u{E001}", "\u{E002}", "\u{E003}"];

impl SegmentFrames {
    /// Frames for `framing`. A chat template is rendered once for `[system, user, assistant,
    /// user]` with marker contents and cut at the markers; it must frame the assistant turn the
    /// same way in the history as in the generation prompt, else the error says to use `--raw`.
    pub fn new(
        tok: &Tokenizer,
        template: Option<&ChatTemplate>,
        framing: Framing,
    ) -> Result<Self, String> {
        let bos = |ids: Vec<u32>| match tok.bos_id() {
            Some(b) if ids.len() >= 2 && ids[0] == b && ids[1] == b => ids[1..].to_vec(),
            _ => ids,
        };
        let encode = |s: &str| tok.encode(s, false).map_err(|e| e.to_string());
        if framing == Framing::Raw {
            let open = bos(tok.encode("", true).map_err(|e| e.to_string())?);
            return Ok(SegmentFrames { system_open: open, ..Default::default() });
        }
        let template = template
            .ok_or("the model has no chat template; pass --raw to concatenate the texts alone")?;
        let roles = ["system", "user", "assistant", "user"];
        let messages: Vec<ChatMessage> =
            roles.iter().zip(MARKERS).map(|(r, m)| ChatMessage::new(*r, m)).collect();
        let text = template.render(&messages, true).map_err(|e| e.to_string())?;
        let mut pieces = Vec::new();
        let mut rest = text.as_str();
        for marker in MARKERS {
            let at = rest.find(marker).ok_or_else(|| {
                format!(
                    "the chat template drops or reorders message contents; pass --raw ({text:?})"
                )
            })?;
            pieces.push(&rest[..at]);
            rest = &rest[at + marker.len()..];
        }
        pieces.push(rest);
        // pieces: [open, system→user, user→assistant, assistant→user, user→generation]
        if pieces[2] != pieces[4] {
            return Err(format!(
                "the chat template frames the assistant turn differently in the history ({:?}) \
                 than in the generation prompt ({:?}); pass --raw",
                pieces[2], pieces[4]
            ));
        }
        Ok(SegmentFrames {
            system_open: bos(tok.encode(pieces[0], true).map_err(|e| e.to_string())?),
            system_close: encode(pieces[1])?,
            user_open: encode(pieces[3])?,
            user_close: encode(pieces[2])?,
        })
    }

    /// `open + text + close` with exactly `len` ids, the text cut to fit; errors if the frames
    /// alone leave no room for one text token.
    fn segment(
        tok: &Tokenizer,
        rng: &mut SplitMix64,
        len: usize,
        open: &[u32],
        close: &[u32],
        (what, flag): (&str, &str),
    ) -> Result<Vec<u32>, String> {
        let frames = open.len() + close.len();
        if len <= frames {
            return Err(format!(
                "{what} of {len} tokens cannot hold its chat-template headers ({frames} tokens) \
                 and some text; raise {flag} or pass --raw"
            ));
        }
        let text = exact_tokens(tok, rng, len - frames).map_err(|e| e.to_string())?;
        Ok([open, &text, close].concat())
    }
}

/// The sizes of a multi-turn chat workload.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MultiturnSpec {
    pub users: usize,
    /// Tokens of the system prompt every user shares.
    pub system_tokens: usize,
    pub turns: usize,
    /// Tokens of each user message, drawn uniformly from `min..=max`.
    pub user_tokens_min: usize,
    pub user_tokens_max: usize,
    /// Tokens of each reply (greedy, end-of-sequence ignored, so exactly this many).
    pub reply_tokens: usize,
    pub seed: u64,
    pub framing: Framing,
}

impl MultiturnSpec {
    /// Refuses zero sizes and an empty or inverted message range, naming the flag.
    pub fn validate(&self) -> Result<(), String> {
        for (v, flag) in [
            (self.users, "--users"),
            (self.system_tokens, "--system-tokens"),
            (self.turns, "--turns"),
            (self.reply_tokens, "--reply-tokens"),
            (self.user_tokens_min, "--user-tokens-min"),
        ] {
            if v == 0 {
                return Err(format!("{flag} must be at least 1"));
            }
        }
        if self.user_tokens_max < self.user_tokens_min {
            return Err(format!(
                "--user-tokens-max {} is below --user-tokens-min {}",
                self.user_tokens_max, self.user_tokens_min
            ));
        }
        Ok(())
    }
}

/// The token ids of a multi-turn workload; replies come from the model at run time.
#[derive(Clone, Debug)]
pub struct MultiturnWorkload {
    pub spec: MultiturnSpec,
    /// `[system_tokens]`
    pub system: Vec<u32>,
    /// `[users][turns][u(i, k)]` message segments, frames included.
    pub messages: Vec<Vec<Vec<u32>>>,
}

impl MultiturnWorkload {
    /// Generates the system prompt and every message, seeded by `spec.seed`.
    pub fn generate(
        spec: &MultiturnSpec,
        tok: &Tokenizer,
        template: Option<&ChatTemplate>,
    ) -> Result<Self, String> {
        spec.validate()?;
        let frames = SegmentFrames::new(tok, template, spec.framing)?;
        let mut rng = SplitMix64::derive(spec.seed, &[u64::MAX]);
        let system = SegmentFrames::segment(
            tok,
            &mut rng,
            spec.system_tokens,
            &frames.system_open,
            &frames.system_close,
            ("the system prompt", "--system-tokens"),
        )?;
        let mut messages = Vec::with_capacity(spec.users);
        for user in 0..spec.users {
            let mut turns = Vec::with_capacity(spec.turns);
            for turn in 0..spec.turns {
                let mut rng = SplitMix64::derive(spec.seed, &[user as u64, turn as u64]);
                let len = rng.range(spec.user_tokens_min, spec.user_tokens_max);
                let open: &[u32] = if turn == 0 { &[] } else { &frames.user_open };
                let what = ("a user message", "--user-tokens-min");
                turns.push(SegmentFrames::segment(
                    tok,
                    &mut rng,
                    len,
                    open,
                    &frames.user_close,
                    what,
                )?);
            }
            messages.push(turns);
        }
        Ok(MultiturnWorkload { spec: spec.clone(), system, messages })
    }

    /// Prompt tokens of `user`'s turn `turn` (0-based): `S + Σ_{j≤turn} u(user, j) + turn·R`.
    pub fn prompt_len(&self, user: usize, turn: usize) -> usize {
        let messages: usize = self.messages[user][..=turn].iter().map(Vec::len).sum();
        self.system.len() + messages + turn * self.spec.reply_tokens
    }

    /// The longest conversation, last reply included: the context length (`-c`) it needs.
    pub fn longest_conversation(&self) -> usize {
        let last = self.spec.turns - 1;
        (0..self.spec.users).map(|u| self.prompt_len(u, last)).max().unwrap_or(0)
            + self.spec.reply_tokens
    }

    /// The prefill arithmetic of this workload for `block_size`-token blocks.
    pub fn arithmetic(&self, block_size: usize) -> PrefillArithmetic {
        let (users, turns, r) = (self.spec.users, self.spec.turns, self.spec.reply_tokens);
        let s = self.system.len();
        let (mut no_reuse, mut ideal_blocks, mut system_only) = (0, 0, 0);
        let floor_block = |n: usize| n / block_size * block_size;
        for user in 0..users {
            for turn in 0..turns {
                let p = self.prompt_len(user, turn);
                no_reuse += p;
                let system_hit = if (user, turn) == (0, 0) { 0 } else { floor_block(s.min(p - 1)) };
                system_only += p - system_hit;
                let cached = match turn {
                    0 => system_hit,
                    _ => floor_block((self.prompt_len(user, turn - 1) + r - 1).min(p - 1)),
                };
                ideal_blocks += p - cached;
            }
        }
        let messages: usize = self.messages.iter().flatten().map(Vec::len).sum();
        PrefillArithmetic {
            no_reuse_prefill_tokens: no_reuse as u64,
            ideal_prefill_tokens: (s + messages + users * (turns - 1)) as u64,
            ideal_block_prefill_tokens: ideal_blocks as u64,
            system_only_prefill_tokens: system_only as u64,
            one_block_per_turn_tokens: (users * turns * block_size) as u64,
        }
    }
}

/// What the prefill of a multi-turn workload costs, in computed tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PrefillArithmetic {
    /// No reuse: every turn prefills its whole prompt, `Σ_{i,k} prompt(i, k)`.
    pub no_reuse_prefill_tokens: u64,
    /// Every token's KV computed once: the system prompt once, each user message once, and the
    /// last token of each reply but the final one (sampled, never fed back while its turn ran;
    /// the rest of a reply is computed by decode and cached). `S + Σ u + U·(T−1)`.
    pub ideal_prefill_tokens: u64,
    /// What an unbounded cache of whole blocks computes: as the ideal, plus per turn the tokens
    /// of the previous partial block (and, for every user after the first, the system prompt's
    /// partial last block). At most `ideal + U·T·(block_size − 1)`.
    pub ideal_block_prefill_tokens: u64,
    /// A cache that keeps only the shared system prompt: every turn recomputes the user's
    /// history. What a budget too small for the histories degrades to (LRU evicts each history
    /// before its user comes back); `system_only ÷ ideal_block` is then about the best prefill
    /// ratio a large budget can show over a small one.
    pub system_only_prefill_tokens: u64,
    /// `U·T·block_size`: "within one block per turn" of the ideal.
    pub one_block_per_turn_tokens: u64,
}

/// Prefill tokens of one conversation whose prompts (`prompt_lens`, in turn order) each extend
/// the previous one: `(without reuse, with reuse)`, i.e. `Σ P_k` and `P_1 + Σ (P_k − P_{k−1})`.
/// DESIGN.md's example: a 1024-token system prompt and 8 turns of 100 new tokens give
/// `(11_792, 1_824)`.
pub fn one_conversation_prefill(prompt_lens: &[usize]) -> (u64, u64) {
    let no_reuse = prompt_lens.iter().sum::<usize>() as u64;
    let with_reuse = prompt_lens
        .iter()
        .scan(0usize, |prev, &p| {
            let new = p.saturating_sub(*prev);
            *prev = p;
            Some(new)
        })
        .sum::<usize>() as u64;
    (no_reuse, with_reuse)
}
