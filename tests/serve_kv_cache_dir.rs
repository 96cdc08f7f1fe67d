//! `kvrun serve --kv-cache-dir` across restarts, as a user runs it: the built binary on the real
//! model, stopped with SIGTERM (as service managers stop it) and started again over the same
//! folder, answers a repeated ~900-token prompt from the blocks it wrote (`cached_tokens` at
//! least the prompt's whole blocks) with the same text; after every block file is damaged it
//! still answers the same, recomputing. Needs the real model (scripts/fetch-models.sh).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Kills the server if the test ends early.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    /// SIGTERM, then waits for a clean exit (the engine writes its blocks on the way out).
    fn stop(mut self) {
        let pid = self.0.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("kill runs");
        assert!(sent.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.0.try_wait().unwrap() {
                assert!(status.success(), "kvrun serve exited with {status}");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("kvrun serve did not stop on SIGTERM");
    }
}

/// Starts `kvrun serve` on a free port and waits until its model is loaded; returns it and its
/// address (`host:port`).
fn serve(model: &Path, dir: &Path) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvrun"))
        .args(["serve", "--port", "0", "-c", "1024", "--max-num-seqs", "1"])
        .arg("-m")
        .arg(model)
        .arg("--kv-cache-dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvrun starts");
    let stderr = child.stderr.take().expect("piped");
    let server = Server(child);
    let mut lines = BufReader::new(stderr).lines();
    let mut addr = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let line = lines.next().expect("kvrun serve printed its address").expect("utf-8");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            addr = Some(rest.split_whitespace().next().expect("an address").to_string());
        }
        if let Some(addr) = addr.as_ref().filter(|_| line.contains("ready")) {
            let addr = addr.clone();
            std::thread::spawn(move || lines.for_each(drop)); // never block on a full pipe
            return (server, addr);
        }
    }
    panic!("kvrun serve did not get ready");
}

/// POSTs `body` to `path` over HTTP/1.1; returns the status and the JSON body.
fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let json = out.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

/// The completion of the prompt: (text, prompt tokens, cached tokens).
fn complete(addr: &str, prompt: &str) -> (String, u64, u64) {
    let (status, v) = post(
        addr,
        "/v1/completions",
        &json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": prompt, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    let usage = &v["usage"];
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    )
}

fn block_files(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .collect()
}

#[test]
fn serve_restarted_over_its_kv_cache_dir_answers_from_it() {
    let Some(model) = common::real_model("serve_kv_cache_dir") else { return };
    if common::gpu().is_none() {
        return;
    }
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/text/alice-ch1-9.txt"),
    )
    .unwrap();
    let prompt: String = text.chars().take(3500).collect();
    let dir = std::env::temp_dir().join(format!("kvrun-serve-kv-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    let (server, addr) = serve(&model, &dir);
    let (first, prompt_tokens, cold) = complete(&addr, &prompt);
    assert!((850..1000).contains(&prompt_tokens), "{prompt_tokens} prompt tokens");
    assert_eq!(cold, 0);
    server.stop();
    let whole = (prompt_tokens - 1) / 16 * 16;
    assert!(block_files(&dir).len() as u64 >= whole / 16, "the blocks were written");

    let (server, addr) = serve(&model, &dir);
    let (again, _, cached) = complete(&addr, &prompt);
    eprintln!("{prompt_tokens} prompt tokens: {cached} cached after a restart");
    assert!(cached >= whole, "{cached} cached tokens after a restart, want ≥ {whole}");
    assert_eq!(again, first, "the same answer from the kept blocks");
    server.stop();

    for (i, f) in block_files(&dir).iter().enumerate() {
        let bytes = std::fs::read(f).unwrap();
        match i % 3 {
            0 => std::fs::write(f, &bytes[..bytes.len() / 3]).unwrap(),
            1 => std::fs::write(f, vec![0u8; bytes.len()]).unwrap(),
            _ => {
                let mut b = bytes;
                b[200] ^= 1;
                std::fs::write(f, b).unwrap();
            }
        }
    }
    let (server, addr) = serve(&model, &dir);
    let (damaged, _, cached) = complete(&addr, &prompt);
    assert_eq!(damaged, first, "the same answer, recomputed");
    assert!(cached < whole, "damaged blocks were used: {cached} cached");
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
