//! Hostile models and flags against the built binary: every case of
//! `scripts/make_hostile_inputs.py` (absurd sizes, missing and misshapen tensors, a tokenizer
//! larger than the embedding, endless chat templates, huge metadata, overlapping tensor data,
//! truncated files, odd paths) and the flag cases on the real model must end in a one-line
//! error naming the file or flag, with a word saying what is wrong, in under 10 s and 1 GiB of
//! RSS (a legal flag that asks for memory, a KV pool, gets that memory and a second per 256 MiB
//! of it on top), never a panic, a hang or a memory bomb. Controls (unchanged copies) must
//! succeed.
//!
//! Needs python3 with `gguf` and `numpy` (scripts/setup.sh installs them); skips without them
//! unless KVRUN_NO_SKIP is set. The flag cases need the real model (scripts/fetch-models.sh).

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WALL_LIMIT: Duration = Duration::from_secs(10);
/// A run still going after this is killed (and fails as a hang).
const KILL_AFTER: Duration = Duration::from_secs(20);
const RSS_LIMIT_KB: u64 = 1024 * 1024;
/// A run whose RSS passes this is killed at once (a memory bomb must not reach the OOM killer).
const RSS_KILL_KB: u64 = 2 * RSS_LIMIT_KB;

/// Cases not yet meeting the bar, each with the reason; they are not run (a memory bomb would
/// strain the machine). Remove an entry when its fix lands.
const OPEN: [(&str, &str); 1] = [(
    "tmpl_str_doubling",
    "a string doubled by `~` in a loop: minijinja has no hook on concatenation and fuel counts \
     instructions, not bytes",
)];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Writes the hostile inputs into a fresh folder; `None` (skip) without python3 + gguf + numpy.
fn make_inputs() -> Option<PathBuf> {
    if !common::python_with_gguf("hostile_inputs") {
        return None;
    }
    let out = std::env::temp_dir().join(format!("kvrun-hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new("python3")
        .arg(repo().join("scripts/make_hostile_inputs.py"))
        .arg(&out)
        .stdout(Stdio::null())
        .status()
        .expect("python3 runs");
    assert!(status.success(), "scripts/make_hostile_inputs.py failed");
    Some(out)
}

struct Run {
    code: Option<i32>,
    stderr: String,
    wall: Duration,
    peak_rss_kb: u64,
    killed: Option<&'static str>,
}

fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs kvrun with `args`, polling its peak RSS (VmHWM) until it exits; kills a hang or a
/// memory bomb (RSS past `RSS_KILL_KB` plus what the flags legitimately ask for, `asked_kb`,
/// and time past `KILL_AFTER` plus the time to touch it, `asked_time`).
fn run(args: &[String], scratch: &Path, asked_kb: u64) -> Run {
    let kill_after = KILL_AFTER + asked_time(asked_kb);
    let (out_path, err_path) = (scratch.join("stdout"), scratch.join("stderr"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvrun"));
    cmd.args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        cmd.env("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let start = Instant::now();
    let mut child = cmd.spawn().expect("kvrun starts");
    let (mut peak, mut killed) = (0, None);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        peak = peak.max(status_kb(child.id(), "VmHWM:").unwrap_or(0));
        if peak > RSS_KILL_KB + asked_kb || start.elapsed() > kill_after {
            killed = Some(if peak > RSS_KILL_KB + asked_kb { "memory bomb" } else { "hang" });
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Run {
        code: status.code(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        wall: start.elapsed(),
        peak_rss_kb: peak,
        killed,
    }
}

/// A clause said twice ("cannot read x: no such file; …: no such file").
fn doubled(line: &str) -> bool {
    let parts: Vec<String> = line
        .split("; ")
        .flat_map(|p| p.split(": "))
        .map(|p| p.trim().to_lowercase())
        .filter(|p| p.len() >= 12)
        .collect();
    let mut unique = parts.clone();
    unique.sort();
    unique.dedup();
    unique.len() != parts.len()
}

/// Memory the case's flags legitimately ask for (a KV pool the user sized: on a CPU adapter
/// device memory is host memory), added to the RSS bar.
fn asked_kb(case: &Value) -> u64 {
    case["asked_mib"].as_u64().unwrap_or(0) * 1024
}

/// Time allowed on top of the bar for memory a flag legitimately asks for: one second per
/// 128 MiB. On lavapipe a KV pool is zero-filled host memory, and the kernel's first touch of
/// it is the VM's speed: the 3.7 GiB case took 4.3 s on an idle machine and 13.0 s in a CI run
/// right after the build had filled the page cache; on 2026-12-05, on an idle VM with 22 GiB
/// free, 9.5–26 s (`perf`: 84 % of a run in the kernel's `clear_page_erms`), and the commit
/// before issue 10's work 2.4–31 s back to back, with the same RSS and page faults each time.
/// A hang still meets the kill timer; only the allowance for faulting the pages in grew.
fn asked_time(asked_kb: u64) -> Duration {
    Duration::from_secs(asked_kb / (128 * 1024))
}

/// Why `run` misses the bar for `case` (empty: it meets it).
fn judge(case: &Value, r: &Run, file: Option<&Path>) -> Vec<String> {
    let mut bad = Vec::new();
    if let Some(why) = r.killed {
        bad.push(why.to_string());
    }
    if r.stderr.contains("panicked") {
        bad.push("panic".into());
    }
    if r.wall >= WALL_LIMIT + asked_time(asked_kb(case)) {
        bad.push(format!("slow: {:.1} s", r.wall.as_secs_f64()));
    }
    if r.peak_rss_kb >= RSS_LIMIT_KB + asked_kb(case) {
        bad.push(format!("RSS {} MiB", r.peak_rss_kb / 1024));
    }
    if !bad.is_empty() {
        return bad;
    }
    if r.code == Some(0) {
        if !case["accept_success"].as_bool().unwrap() {
            bad.push("exit 0".into());
        }
        return bad;
    }
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.len() != 1 || !lines[0].starts_with("error: ") {
        bad.push(format!("not one error line: {lines:?}"));
        return bad;
    }
    let line = lines[0];
    let full = file.map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let text =
        if full.is_empty() { line.to_lowercase() } else { line.replace(&full, "").to_lowercase() };
    let words = |key: &str| -> Vec<String> {
        case[key].as_array().unwrap().iter().map(|w| w.as_str().unwrap().to_lowercase()).collect()
    };
    let expect = words("expect_any");
    if !expect.is_empty() && !expect.iter().any(|w| text.contains(w)) {
        bad.push(format!("none of {expect:?}"));
    }
    for w in words("reject_any").iter().filter(|w| text.contains(w.as_str())) {
        bad.push(format!("misleading: {w}"));
    }
    if doubled(line) {
        bad.push("doubled clause".into());
    }
    match case["names"].as_str().unwrap() {
        "file" => {
            let name = file.and_then(|f| f.file_name()).unwrap().to_string_lossy().to_lowercase();
            if !line.to_lowercase().contains(&name) {
                bad.push(format!("{name} not named"));
            }
        }
        flag if !line.contains(flag) => bad.push(format!("flag {flag} not named")),
        _ => {}
    }
    bad
}

fn substitute(args: &Value, out: &Path, file: Option<&Path>, real: &Path) -> Vec<String> {
    let text = repo().join("assets/text/alice-ch1-9.txt");
    args.as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            a.replace("{FILE}", &file.unwrap_or(real).to_string_lossy())
                .replace("{REAL}", &real.to_string_lossy())
                .replace("{TEXT}", &text.to_string_lossy())
                .replace("{OUT}", &out.to_string_lossy())
        })
        .collect()
}

#[test]
fn hostile_models_and_flags_get_clear_errors() {
    if common::gpu().is_none() {
        return;
    }
    let Some(out) = make_inputs() else { return };
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let real = common::real_model("hostile_inputs flag cases");
    let mut cases: Vec<&Value> = manifest["cases"].as_array().unwrap().iter().collect();
    match &real {
        Some(_) => cases.extend(manifest["flag_cases"].as_array().unwrap()),
        None => println!("flag cases skipped: no real model"),
    }
    let scratch = out.join("runs");
    std::fs::create_dir_all(&scratch).unwrap();
    let (mut failures, mut ran) = (Vec::new(), 0);
    for case in cases {
        let id = case["id"].as_str().unwrap();
        if let Some((_, why)) = OPEN.iter().find(|(open, _)| id.starts_with(open)) {
            println!("{id}: not run, open: {why}");
            continue;
        }
        let file = case["file"].as_str().filter(|f| !f.is_empty()).map(|f| out.join(f));
        let real = real.clone().unwrap_or_default();
        let args = substitute(&case["args"], &out, file.as_deref(), &real);
        let r = run(&args, &scratch, asked_kb(case));
        ran += 1;
        let bad = judge(case, &r, file.as_deref());
        let first_line = r.stderr.lines().next().unwrap_or("");
        println!(
            "{id}: exit {:?}, {:.2} s, {} MiB: {} {first_line}",
            r.code,
            r.wall.as_secs_f64(),
            r.peak_rss_kb / 1024,
            if bad.is_empty() { "ok" } else { "FAIL" }
        );
        if !bad.is_empty() {
            failures.push(format!(
                "{id} ({}): {}\n    {first_line}",
                bad.join(", "),
                args.join(" ")
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(ran >= 40, "only {ran} cases ran; the manifest lost its cases");
    assert!(
        failures.is_empty(),
        "{} of {ran} cases miss the bar:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn doubled_clauses_are_detected() {
    assert!(doubled(
        "error: cannot read x: no such file or directory; check: no such file or directory"
    ));
    assert!(!doubled(
        "error: cannot read x: No such file or directory (os error 2); check the path"
    ));
}
