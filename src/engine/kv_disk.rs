//! The disk tier (`--kv-cache-dir`): KV blocks kept in files across restarts, one file a block,
//! named by its [`BlockKey`] under a folder named by the model's fingerprint (the model file's
//! size and first and last bytes, the KV format, the block size and bytes: KV from another model
//! or format is never looked at). What the host tier drops is spilled here, and at shutdown the
//! pool's and the host tier's blocks are written; a prompt whose cached prefix continues into
//! disk keys has them read back into the host tier before the step is planned.
//!
//! A file is `KVRUNKV1`, the fingerprint (32 bytes), the key (32), the payload's length (u64 LE),
//! its SHA-256 (32), then the payload. Every read checks all of them: a truncated, zeroed,
//! foreign or corrupt file, or one that cannot be read, costs a warning and a recompute (the
//! file is removed), never a wrong answer. A write that fails (disk full, permissions) costs a
//! warning once and the block is not kept. Files are written to a temporary name and renamed.
//! Least recently written or read files are removed first to stay within
//! `--kv-cache-dir-size`.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::kv::{format_bytes, BlockKey};

use super::EngineError;

const MAGIC: &[u8; 8] = b"KVRUNKV1";
const HEADER_BYTES: usize = 8 + 32 + 32 + 8 + 32;
/// The model file's first and last bytes hashed into the fingerprint.
const HEAD_BYTES: u64 = 16 << 20;
const TAIL_BYTES: u64 = 1 << 20;

/// Counters of the disk tier since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskTierStats {
    /// Files found at start (before any check).
    pub found: usize,
    pub written: u64,
    pub read: u64,
    /// Files refused when read (damaged, foreign, unreadable) or not written.
    pub failed: u64,
}

/// The files of one model and KV format, and their order of use.
#[derive(Debug)]
pub(super) struct DiskKvStore {
    dir: PathBuf,
    fingerprint: [u8; 32],
    block_bytes: usize,
    capacity: usize,
    /// key → last use
    index: HashMap<BlockKey, u64>,
    lru: BTreeSet<(u64, BlockKey)>,
    clock: u64,
    write_warned: bool,
    pub(super) stats: DiskTierStats,
}

/// The fingerprint of the KV a model gives: its file(s) (size, first and last bytes) and what
/// shapes its blocks (`kv` names the format, block size and bytes).
pub(super) fn fingerprint(model: &Path, kv: &str) -> Result<[u8; 32], EngineError> {
    let mut h = Sha256::new();
    h.update(b"kvrun kv fingerprint v1\0");
    h.update(kv.as_bytes());
    let mut files: Vec<PathBuf> = if model.is_dir() {
        let entries = std::fs::read_dir(model).map_err(|e| {
            EngineError::Config(format!("cannot list {} for --kv-cache-dir: {e}", model.display()))
        })?;
        entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect()
    } else {
        vec![model.to_path_buf()]
    };
    files.sort();
    for path in files {
        let cant = |e: std::io::Error| {
            EngineError::Config(format!("cannot read {} for --kv-cache-dir: {e}", path.display()))
        };
        let mut f = std::fs::File::open(&path).map_err(cant)?;
        let len = f.metadata().map_err(cant)?.len();
        h.update(path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
        h.update(len.to_le_bytes());
        let mut head = Vec::new();
        (&mut f).take(HEAD_BYTES).read_to_end(&mut head).map_err(cant)?;
        h.update(&head);
        if len > HEAD_BYTES {
            use std::io::{Seek, SeekFrom};
            f.seek(SeekFrom::Start(len - TAIL_BYTES.min(len - HEAD_BYTES))).map_err(cant)?;
            let mut tail = Vec::new();
            f.take(TAIL_BYTES).read_to_end(&mut tail).map_err(cant)?;
            h.update(&tail);
        }
    }
    Ok(h.finalize().into())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_key(name: &str) -> Option<BlockKey> {
    let stem = name.strip_suffix(".kvb")?;
    if stem.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(stem.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
}

impl DiskKvStore {
    /// Opens (creating) `root/<fingerprint>/` and indexes its block files, newest last; removes
    /// the oldest beyond `size` bytes. Errors if the folder cannot be made or listed.
    pub(super) fn open(
        root: &Path,
        size: u64,
        fingerprint: [u8; 32],
        block_bytes: u64,
    ) -> Result<Self, EngineError> {
        let file_bytes = block_bytes + HEADER_BYTES as u64;
        let capacity = usize::try_from(size / file_bytes).unwrap_or(usize::MAX);
        if capacity == 0 {
            return Err(EngineError::Config(format!(
                "--kv-cache-dir-size {} holds no KV block of this model ({} each); give at least \
                 that",
                format_bytes(size),
                format_bytes(file_bytes)
            )));
        }
        let dir = root.join(hex(&fingerprint[..8]));
        std::fs::create_dir_all(&dir).map_err(|e| {
            EngineError::Config(format!("cannot create --kv-cache-dir {}: {e}", dir.display()))
        })?;
        let entries = std::fs::read_dir(&dir).map_err(|e| {
            EngineError::Config(format!("cannot list --kv-cache-dir {}: {e}", dir.display()))
        })?;
        let mut found: Vec<(std::time::SystemTime, BlockKey)> = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(key) = name.to_str().and_then(parse_key) else { continue };
            let modified = entry.metadata().and_then(|m| m.modified());
            found.push((modified.unwrap_or(std::time::UNIX_EPOCH), key));
        }
        found.sort();
        let mut store = DiskKvStore {
            dir,
            fingerprint,
            block_bytes: block_bytes as usize,
            capacity,
            index: HashMap::new(),
            lru: BTreeSet::new(),
            clock: 0,
            write_warned: false,
            stats: DiskTierStats { found: found.len(), ..DiskTierStats::default() },
        };
        for (_, key) in found {
            store.touch(key);
        }
        store.trim();
        Ok(store)
    }

    fn path(&self, key: &BlockKey) -> PathBuf {
        self.dir.join(format!("{}.kvb", hex(key)))
    }

    pub(super) fn contains(&self, key: &BlockKey) -> bool {
        self.index.contains_key(key)
    }

    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    fn touch(&mut self, key: BlockKey) {
        self.clock += 1;
        if let Some(old) = self.index.insert(key, self.clock) {
            self.lru.remove(&(old, key));
        }
        self.lru.insert((self.clock, key));
    }

    fn forget(&mut self, key: &BlockKey) {
        if let Some(at) = self.index.remove(key) {
            self.lru.remove(&(at, *key));
        }
        let _ = std::fs::remove_file(self.path(key));
    }

    /// Removes the least recently used files beyond the capacity.
    fn trim(&mut self) {
        while self.index.len() > self.capacity {
            let Some(&(_, key)) = self.lru.first() else { break };
            self.forget(&key);
        }
    }

    /// Keeps `payload` (one block's bytes) as `key`'s file, unless it is kept already.
    pub(super) fn write(&mut self, key: BlockKey, payload: &[u8]) {
        if self.contains(&key) {
            self.touch(key);
            return;
        }
        debug_assert_eq!(payload.len(), self.block_bytes);
        let mut bytes = Vec::with_capacity(HEADER_BYTES + payload.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&self.fingerprint);
        bytes.extend_from_slice(&key);
        bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&Sha256::digest(payload));
        bytes.extend_from_slice(payload);
        let path = self.path(&key);
        let tmp = path.with_extension("tmp");
        let written = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &path));
        match written {
            Ok(()) => {
                self.stats.written += 1;
                self.touch(key);
                self.trim();
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                self.stats.failed += 1;
                if !std::mem::replace(&mut self.write_warned, true) {
                    tracing::warn!(
                        "--kv-cache-dir: cannot write {}: {e}; blocks that do not fit are \
                         recomputed when needed",
                        path.display()
                    );
                }
            }
        }
    }

    /// `key`'s block, checked whole; `None` (with a warning, the file removed) if it is
    /// missing, damaged or not this model's.
    pub(super) fn read(&mut self, key: &BlockKey) -> Option<Vec<u8>> {
        let path = self.path(key);
        let checked = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| self.check(key, &bytes).map(|()| bytes[HEADER_BYTES..].to_vec()));
        match checked {
            Ok(payload) => {
                self.stats.read += 1;
                self.touch(*key);
                Some(payload)
            }
            Err(why) => {
                self.stats.failed += 1;
                tracing::warn!(
                    "--kv-cache-dir: {} is unusable ({why}); its tokens are recomputed",
                    path.display()
                );
                self.forget(key);
                None
            }
        }
    }

    fn check(&self, key: &BlockKey, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() < HEADER_BYTES {
            return Err(format!("{} bytes, shorter than a header", bytes.len()));
        }
        if &bytes[..8] != MAGIC {
            return Err("not a kvrun KV block file".into());
        }
        if bytes[8..40] != self.fingerprint {
            return Err("written for another model or KV format".into());
        }
        if bytes[40..72] != key[..] {
            return Err("holds another block".into());
        }
        let len = u64::from_le_bytes(bytes[72..80].try_into().expect("8 bytes"));
        let payload = &bytes[HEADER_BYTES..];
        if len != self.block_bytes as u64 || payload.len() as u64 != len {
            return Err(format!(
                "{} payload bytes, header says {len}, a block is {}",
                payload.len(),
                self.block_bytes
            ));
        }
        if Sha256::digest(payload)[..] != bytes[80..112] {
            return Err("checksum mismatch".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path, blocks: u64) -> DiskKvStore {
        DiskKvStore::open(dir, blocks * (16 + HEADER_BYTES as u64), [7; 32], 16).unwrap()
    }

    fn key(i: u8) -> BlockKey {
        [i; 32]
    }

    #[test]
    fn blocks_survive_a_reopen_and_damage_costs_only_the_block() {
        let tmp = tempdir();
        let mut s = store(tmp.path(), 8);
        for i in 0..6 {
            s.write(key(i), &[i; 16]);
        }
        drop(s);
        let mut s = store(tmp.path(), 8);
        assert_eq!(s.stats.found, 6);
        assert_eq!(s.read(&key(0)).as_deref(), Some(&[0u8; 16][..]));
        // damage each way: truncated, zeroed, another block's bytes, a flipped payload bit,
        // another model's file, unreadable (a folder where the file was)
        let dir = s.dir.clone();
        let path = |i: u8| dir.join(format!("{}.kvb", hex(&key(i))));
        let bytes = std::fs::read(path(1)).unwrap();
        std::fs::write(path(1), &bytes[..bytes.len() - 3]).unwrap();
        std::fs::write(path(2), vec![0u8; bytes.len()]).unwrap();
        std::fs::copy(path(0), path(3)).unwrap();
        let mut flipped = std::fs::read(path(4)).unwrap();
        *flipped.last_mut().unwrap() ^= 1;
        std::fs::write(path(4), flipped).unwrap();
        let mut other = bytes.clone();
        other[8] ^= 0xff;
        std::fs::write(path(5), other).unwrap();
        for i in 1..=5 {
            assert_eq!(s.read(&key(i)), None, "damaged file {i} was read");
            assert!(!s.contains(&key(i)) && !path(i).exists(), "damaged file {i} stays");
        }
        s.write(key(9), &[9; 16]);
        std::fs::remove_file(path(9)).unwrap();
        std::fs::create_dir(path(9)).unwrap();
        assert_eq!(s.read(&key(9)), None);
        assert_eq!(s.stats.failed, 6);
        assert_eq!(s.read(&key(0)).as_deref(), Some(&[0u8; 16][..]), "the good one stays");
    }

    #[test]
    fn another_fingerprint_sees_nothing_and_the_oldest_go_first() {
        let tmp = tempdir();
        let mut s = store(tmp.path(), 2);
        s.write(key(1), &[1; 16]);
        s.write(key(2), &[2; 16]);
        s.read(&key(1)).unwrap(); // 2 is now the oldest
        s.write(key(3), &[3; 16]);
        assert!(s.contains(&key(1)) && !s.contains(&key(2)) && s.contains(&key(3)));
        let other = DiskKvStore::open(tmp.path(), 1 << 20, [8; 32], 16).unwrap();
        assert_eq!(other.len(), 0, "another model's folder");
    }

    #[test]
    fn an_unwritable_folder_warns_and_keeps_nothing() {
        let tmp = tempdir();
        let mut s = store(tmp.path(), 4);
        std::fs::remove_dir_all(&s.dir).unwrap();
        std::fs::write(&s.dir, b"a file where the folder was").unwrap();
        s.write(key(1), &[1; 16]);
        assert!(!s.contains(&key(1)));
        assert_eq!(s.stats.failed, 1);
    }

    /// A full disk (the block's temporary file is `/dev/full`, whose writes fail with ENOSPC):
    /// the block is not kept, one warning, nothing left behind; the next block writes.
    #[cfg(unix)]
    #[test]
    fn a_full_disk_keeps_nothing_and_loses_nothing() {
        let tmp = tempdir();
        let mut s = store(tmp.path(), 4);
        let tmp_file = s.path(&key(1)).with_extension("tmp");
        std::os::unix::fs::symlink("/dev/full", &tmp_file).unwrap();
        s.write(key(1), &[1; 16]);
        assert!(!s.contains(&key(1)) && !s.path(&key(1)).exists());
        assert!(std::fs::symlink_metadata(&tmp_file).is_err(), "the temporary file stays");
        assert_eq!((s.stats.failed, s.stats.written), (1, 0));
        s.write(key(2), &[2; 16]);
        assert_eq!(s.read(&key(2)).as_deref(), Some(&[2u8; 16][..]));
    }

    /// A fresh folder, removed with everything in it when the test ends.
    fn tempdir() -> tempfile::TempDir {
        tempfile::Builder::new().prefix("kvrun-disk-test-").tempdir().unwrap()
    }
}
