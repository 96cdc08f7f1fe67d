//! Chat templates: HF's Jinja templates rendered with minijinja, set up the way
//! `transformers.apply_chat_template` sets up jinja2 (`trim_blocks`, `lstrip_blocks`,
//! `raise_exception`, `strftime_now`, Python string methods through pycompat).

use super::TokenizerError;
use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's reasoning, given apart from its content (templates such as
    /// Qwen3.5's read it); absent from the template's view when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An assistant turn's tool calls (`[{id, type, function: {name, arguments}}]`, arguments
    /// as an object, as templates iterate them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A tool turn: the call it answers, and the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// Variables a caller passes to the chat template beside the conversation (OpenAI servers'
/// `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`).
pub type TemplateVars = serde_json::Map<String, serde_json::Value>;

/// The variables every render sets itself, which [`TemplateVars`] may not name.
pub const RESERVED_TEMPLATE_VARS: [&str; 4] =
    ["messages", "add_generation_prompt", "bos_token", "eos_token"];

/// Refuses `vars` naming one of [`RESERVED_TEMPLATE_VARS`] (the one check: renders and the
/// server's request parsing call it).
pub fn check_template_vars(vars: &TemplateVars) -> Result<(), String> {
    match RESERVED_TEMPLATE_VARS.iter().find(|n| vars.contains_key(**n)) {
        Some(name) => Err(format!(
            "chat_template_kwargs sets `{name}`, which the request itself sets; remove it"
        )),
        None => Ok(()),
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    /// Where the template came from, at the start of every error.
    origin: String,
}

const NAME: &str = "chat";

/// Instructions one render may execute (minijinja fuel). A real template spends a few
/// hundred per message (SmolLM2's: ~250 for a short turn), so this allows conversations of
/// thousands of turns while a template looping 10^10 times stops within a second.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// Bytes a rendered prompt may hold: far above any context kvrun runs (a million tokens is
/// ~4 MiB of text), far below what would strain memory.
pub const MAX_PROMPT_BYTES: usize = 64 << 20;

/// Macro nesting a template may reach (minijinja's default is 500).
const RECURSION_LIMIT: usize = 100;

/// Where a template comes from, for errors, when the caller does not say.
const ORIGIN: &str = "the model's chat template (GGUF tokenizer.chat_template, or \
                      chat_template in tokenizer_config.json)";

impl ChatTemplate {
    /// Compile `source`; `bos`/`eos` are the texts templates see as `bos_token`/`eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, TokenizerError> {
        Self::with_origin(source, bos, eos, None)
    }

    /// [`ChatTemplate::new`], naming `origin` (e.g. "model.gguf: tokenizer.chat_template") in
    /// every error.
    pub fn with_origin(
        source: &str,
        bos: &str,
        eos: &str,
        origin: Option<&str>,
    ) -> Result<Self, TokenizerError> {
        let origin = origin.unwrap_or(ORIGIN).to_string();
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        // one error line in every build (minijinja's debug info, on by default in debug builds,
        // appends the template source and variables to an error's message)
        env.set_debug(false);
        env.set_recursion_limit(RECURSION_LIMIT);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_filter("tojson", tojson);
        env.add_function("strftime_now", |format: String| {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            strftime_utc(&format, secs)
        });
        env.add_template_owned(NAME, source.to_string()).map_err(|e| template_err(&origin, e))?;
        Ok(ChatTemplate { env, bos: bos.to_string(), eos: eos.to_string(), origin })
    }

    /// The prompt text for `messages`; with `add_generation_prompt`, ending with the header
    /// of an assistant turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_with(messages, add_generation_prompt, &TemplateVars::new())
    }

    /// [`ChatTemplate::render`] with more variables for the template. Errors if `vars` names
    /// one of [`RESERVED_TEMPLATE_VARS`].
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        vars: &TemplateVars,
    ) -> Result<String, TokenizerError> {
        check_template_vars(vars).map_err(TokenizerError::Template)?;
        let origin = &self.origin;
        let tmpl = self.env.get_template(NAME).map_err(|e| template_err(origin, e))?;
        let mut out = CappedWriter { buf: Vec::new(), cap: MAX_PROMPT_BYTES, full: false };
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos,
            eos_token => &self.eos,
            ..minijinja::Value::from_serialize(vars)
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.buf)
                .map_err(|_| TokenizerError::Template(format!("{ORIGIN} rendered invalid UTF-8"))),
            Err(_) if out.full => Err(TokenizerError::Template(format!(
                "{origin} rendered more than {MAX_PROMPT_BYTES} bytes; the template is broken, \
                 fix or replace it"
            ))),
            Err(e) => Err(template_err(origin, e)),
        }
    }
}

/// HF transformers' `tojson` filter (Python's `json.dumps`): `", "` and `": "` between items,
/// keys in their order (`sort_keys=true` sorts them), no HTML escaping (minijinja's own escapes
/// `<`, `>`, `&` and `'`), `indent=N` pretty-printed as `json.dumps` does. Tool definitions
/// rendered into a prompt are then byte for byte what transformers and vLLM render.
fn tojson(
    value: minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> Result<minijinja::Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<minijinja::Value> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    if sort_keys == Some(true) {
        json = sorted(json);
    }
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let f = serde_json::ser::PrettyFormatter::with_indent(&pad);
            serde::Serialize::serialize(
                &json,
                &mut serde_json::Serializer::with_formatter(&mut out, f),
            )
        }
        None => serde::Serialize::serialize(
            &json,
            &mut serde_json::Serializer::with_formatter(&mut out, PythonFormatter),
        ),
    };
    written.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(minijinja::Value::from_safe_string(text))
}

/// `json` with every object's keys sorted.
fn sorted(json: serde_json::Value) -> serde_json::Value {
    match json {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sorted).collect())
        }
        other => other,
    }
}

/// `", "` before every item but the first of an array or object.
fn item_separator<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

/// `json.dumps`'s default separators: `", "` and `": "`.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        item_separator(w, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        item_separator(w, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// A writer that refuses to grow past `cap` bytes (and remembers that it did).
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
    full: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.cap {
            self.full = true;
            return Err(std::io::Error::other("chat template output cap reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn template_err(origin: &str, e: Error) -> TokenizerError {
    // `{:#}` includes the template line the error points at.
    let hint = match e.kind() {
        ErrorKind::OutOfFuel => format!(
            "; it ran more than {TEMPLATE_FUEL} instructions, so it loops without end or \
             nearly so: fix or replace it"
        ),
        _ => String::new(),
    };
    TokenizerError::Template(format!("{origin}: {e:#}{hint}"))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A small `strftime` for UTC `secs` since the epoch: `%Y %m %d %B %b %H %M %S %%` (what chat
/// templates use, e.g. Llama 3's `strftime_now("%d %b %Y")`); other directives pass through.
fn strftime_utc(format: &str, secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        assert_eq!(strftime_utc("%d %b %Y", 0), "01 Jan 1970");
        // 2024-02-29 13:45:07 UTC
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S %B %%", 1_709_214_307),
            "2024-02-29 13:45:07 February %"
        );
    }

    #[test]
    fn raise_exception_and_python_methods() {
        let t = ChatTemplate::new(
            "{% if messages[0].role == 'bad' %}{{ raise_exception('no ' + 'bad') }}{% endif %}\
             {{ messages[0].content.strip() }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        assert_eq!(t.render(&[ChatMessage::new("user", "  hi  ")], false).unwrap(), "hi");
        let err = t.render(&[ChatMessage::new("bad", "x")], false).unwrap_err();
        assert!(err.to_string().contains("no bad"), "{err}");
    }

    fn render_err(source: &str) -> String {
        let t = ChatTemplate::new(source, "", "").unwrap();
        t.render(&[ChatMessage::new("user", "hi")], true).unwrap_err().to_string()
    }

    #[test]
    fn endless_templates_run_out_of_fuel() {
        let start = std::time::Instant::now();
        let err = render_err(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        );
        assert!(err.contains("fuel") && err.contains("chat template"), "{err}");
        assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
    }

    #[test]
    fn output_is_capped() {
        let err = render_err(
            "{% set a = 'x' * 10000000 %}{% for i in range(100000) %}{{ a }}{% endfor %}",
        );
        assert!(err.contains(&format!("more than {MAX_PROMPT_BYTES} bytes")), "{err}");
    }

    #[test]
    fn deep_recursion_is_refused() {
        let err = render_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
        assert!(err.contains("recursion"), "{err}");
    }

    /// The fuel limit leaves real conversations far inside it: SmolLM2's template over 2,000
    /// turns renders.
    #[test]
    fn long_conversations_fit_the_fuel() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/fixtures/chat/smollm2.jinja");
        let source = std::fs::read_to_string(path).unwrap();
        let t = ChatTemplate::new(&source, "<|im_start|>", "<|im_end|>").unwrap();
        let turns: Vec<ChatMessage> = (0..2000)
            .map(|i| ChatMessage::new(["user", "assistant"][i % 2], format!("turn {i}")))
            .collect();
        let text = t.render(&turns, true).unwrap();
        assert!(text.contains("turn 1999"));
    }

    #[test]
    fn syntax_errors_are_reported() {
        let err = ChatTemplate::new("{% for %}", "", "").err().unwrap();
        assert!(matches!(err, TokenizerError::Template(_)));
    }
}
