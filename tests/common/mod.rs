//! Helpers shared by integration tests.

use std::path::PathBuf;

/// The real SmolLM2 GGUF (env `KVRUN_TEST_MODEL`, default
/// `assets/models/SmolLM2-135M-Instruct.Q4_1.gguf`), or `None` with a printed skip message.
pub fn real_model(test: &str) -> Option<PathBuf> {
    let path = std::env::var_os("KVRUN_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("assets/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    if path.is_file() {
        Some(path)
    } else {
        println!(
            "skipping {test}: real model {} not found (set KVRUN_TEST_MODEL or fetch it into \
             assets/models/)",
            path.display()
        );
        None
    }
}
