//! `kvrun serve` as clients see it: the built binary on loopback, driven by the official
//! `openai` Python client and checked with `prometheus_client`'s strict OpenMetrics parser
//! (`tests/python/openai_client_test.py`), by the official `anthropic` client
//! (`tests/python/anthropic_client_test.py`), and its chat page in headless chromium
//! (`tests/python/chat_page_test.py`). `scripts/setup.sh` installs what they need; they skip
//! without it unless `KVRUN_NO_SKIP=1`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the server when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python_ready() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import openai, anthropic, prometheus_client.openmetrics.parser, jsonschema"])
        .output()
        .map_err(|e| format!("no python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "python3 lacks openai / anthropic / prometheus-client / jsonschema (run scripts/setup.sh): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Starts `kvrun serve` on a free port; returns it and its base URL (read from its first line).
fn serve(model: &Path, extra: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvrun"))
        .arg("serve")
        .arg("-m")
        .arg(model)
        .args(["--port", "0"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvrun starts");
    let stderr = child.stderr.take().expect("piped");
    let server = Server(child);
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let line = lines.next().expect("kvrun serve printed its address").expect("utf-8");
        if let Some(rest) = line.split("listening on ").nth(1) {
            let base = rest.split_whitespace().next().expect("an address").to_string();
            // Keep draining stderr so the server never blocks on a full pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return (server, base);
        }
    }
    panic!("kvrun serve did not report its address");
}

/// Runs `tests/python/SCRIPT` with `args` (the server's address first) and checks it passed:
/// its exit status, and its last summary line (`ends`).
fn run_script(script: &str, args: &[&str], ends: impl Fn(&str) -> bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(root.join("tests/python").join(script))
        .args(args)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script} failed:\n{stdout}");
    assert!(stdout.lines().any(&ends), "{stdout}");
}

/// The tiny model's path.
fn tiny_model() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-llama/tiny-llama-q.gguf")
}

/// Python with the clients' packages, or a skip (a failure under `KVRUN_NO_SKIP`).
fn clients_ready() -> bool {
    if let Err(why) = python_ready() {
        assert!(!common::no_skip(), "{why} and KVRUN_NO_SKIP is set");
        eprintln!("SKIPPING: {why}");
        return false;
    }
    true
}

#[test]
fn official_openai_client_against_kvrun_serve() {
    if common::gpu().is_none() || !clients_ready() {
        return;
    }
    let (_server, base) = serve(&tiny_model(), &["--api-key", "test-key", "-c", "256"]);
    run_script("openai_client_test.py", &[&base, "test-key"], |l| l.ends_with(" passed, 0 failed"));
}

/// `tests/python/anthropic_client_test.py`: the official `anthropic` client against
/// `/v1/messages` (create, stream, count_tokens, a forced tool call and its result, an error).
#[test]
fn official_anthropic_client_against_kvrun_serve() {
    if common::gpu().is_none() || !clients_ready() {
        return;
    }
    let args = ["--api-key", "test-key", "-c", "256", "--served-model-name", "tiny"];
    let (_server, base) = serve(&tiny_model(), &args);
    let script_args = [base.as_str(), "test-key", "tiny"];
    run_script("anthropic_client_test.py", &script_args, |l| l.ends_with(" passed, 0 failed"));
}

/// `tests/python/chat_page_test.py`: the chat page at `GET /` in Debian's headless chromium
/// (selenium through chromedriver) against SmolLM2: type, send, the reply streams, the KV
/// panel's numbers change (the second turn's cached tokens and prefix hits). Needs `chromium`,
/// `chromium-driver` and the `selenium` package (`scripts/setup.sh` installs them).
#[test]
fn chat_page_in_a_headless_browser() {
    let Some(model) = common::real_model("chat_page_in_a_headless_browser") else { return };
    if common::gpu().is_none() {
        return;
    }
    let ready = Path::new("/usr/bin/chromium").exists()
        && Path::new("/usr/bin/chromedriver").exists()
        && Command::new("python3")
            .args(["-c", "import selenium"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !ready {
        let why = "no /usr/bin/chromium, /usr/bin/chromedriver or python3 selenium \
                   (run scripts/setup.sh)";
        assert!(!common::no_skip(), "{why} and KVRUN_NO_SKIP is set");
        eprintln!("SKIPPING: {why}");
        return;
    }
    let (_server, base) = serve(&model, &["--api-key", "page-key", "-c", "1024"]);
    run_script("chat_page_test.py", &[&base, "page-key"], |l| l.starts_with("ok "));
}
