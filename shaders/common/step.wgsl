// What changes from one step to the next, written once per step by the host (engine::Runner).
// Kernels read counts from here; dispatch sizes come from the same numbers on the host.
struct StepInfo {
    num_tokens: u32,        // tokens computed in this step (all sequences)
    num_logits: u32,        // rows gathered for the LM head
    num_seqs: u32,          // sequences in this step (decode ones first)
    num_decode_seqs: u32,   // sequences with exactly one query token
    num_prefill_tiles: u32, // entries of the prefill tile list
    num_stage_rows: u32,    // quantized KV: token rows kv_stage copies to staging
    num_completed_blocks: u32, // quantized KV: blocks kv_quantize quantizes
    num_logit_edits: u32,   // logit edits of the sampler's bias and penalties (logits/edit.wgsl)
}

// One sequence of the step. Its query tokens are rows q_start..q_start+q_len of the step's
// activations and are the last q_len tokens of its context (positions ctx_len-q_len..ctx_len-1).
struct SeqInfo {
    q_start: u32,
    q_len: u32,
    ctx_len: u32,      // tokens in the KV cache once this step's K/V are written
    table_start: u32,  // index of the sequence's first block id in block_tables
    stage_slot: u32,   // quantized KV: the sequence's f16 staging slot (its partial last block)
    state_slot: u32,   // recurrent layers: the sequence's state slot (kernels::delta_net)
    snapshot_slot: u32, // recurrent layers: also write the states after token snapshot_len − 1
    snapshot_len: u32,  //   of the step into this state slot (0: no snapshot)
}
