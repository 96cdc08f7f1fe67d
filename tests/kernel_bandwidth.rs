//! The memory-bandwidth probes of `bench bandwidth` vs the CPU reference: the read probe's
//! per-invocation XOR folds and the copy, at sizes below one workgroup, not a multiple of it,
//! and past `MAX_INVOCATIONS` (several words per invocation), with sentinels past the outputs;
//! with every load width the adapter has (both on lavapipe, which has 64-bit integers).

mod common;

use common::*;
use kvrun::kernels::bandwidth::{
    invocations, probe_runs, BandwidthLoads, BandwidthOp, BandwidthProbe, MAX_INVOCATIONS,
};
use kvrun::kernels::reference;
use rand::Rng;

const SENTINEL_WORD: u32 = 0xDEAD_BEEF;

#[test]
fn bandwidth_probes_match_reference() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let widths = BandwidthLoads::available(&gpu.caps);
    assert_eq!(widths.len(), if gpu.caps.shader_int64 { 2 } else { 1 }, "{widths:?}");
    let mut r = rng(31);
    for words in [1u32, 37, 3 * 256 + 5, MAX_INVOCATIONS + 3 * 1000 + 7] {
        let src: Vec<[u32; 4]> = (0..words).map(|_| r.random()).collect();
        let sb = gpu.storage_buffer_init("src", bytemuck::cast_slice(&src));
        for (probe, loads) in probe_runs(&gpu.caps) {
            let n = probe.dst_words(words) as usize;
            let dst = gpu
                .storage_buffer_init("dst", bytemuck::cast_slice(&vec![[SENTINEL_WORD; 4]; n + 4]));
            let op = BandwidthOp::new(gpu, &t.kernels, probe, loads, &sb, &dst, words);
            run(gpu, |pass| op.record(pass));
            let got: Vec<[u32; 4]> = bytemuck::pod_collect_to_vec(
                &gpu.read_bytes(&dst, 0, (n as u64 + 4) * 16).unwrap(),
            );
            let want = match probe {
                BandwidthProbe::Read => {
                    reference::bandwidth_read(&src, invocations(words) as usize)
                }
                BandwidthProbe::Copy => src.clone(),
            };
            assert_eq!(want.len(), n, "{probe:?} {words}: reference length");
            if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
                panic!(
                    "{probe:?} ({loads:?}) over {words} words: word {i} is {:?}, want {:?}",
                    got[i], want[i]
                );
            }
            assert!(
                got[n..].iter().all(|w| *w == [SENTINEL_WORD; 4]),
                "{probe:?} ({loads:?}) over {words} words wrote past its output"
            );
        }
    }
}

#[test]
fn bandwidth_probe_bytes_and_grid_facts() {
    assert_eq!(BandwidthProbe::Read.bytes_moved(1000), 16_000);
    assert_eq!(BandwidthProbe::Copy.bytes_moved(1000), 32_000);
    assert_eq!(invocations(0), 1);
    assert_eq!(invocations(37), 37);
    assert_eq!(invocations(u32::MAX), MAX_INVOCATIONS);
    assert_eq!(BandwidthProbe::Read.dst_words(10 * MAX_INVOCATIONS), MAX_INVOCATIONS);
    assert_eq!(BandwidthProbe::Copy.dst_words(12345), 12345);
}
