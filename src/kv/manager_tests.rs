//! Unit tests of [`KvManager`]: slots, refusals, forks, sliding windows, integrity.

use super::*;

/// 4 blocks of 4 tokens, 2 layers × 1 KV head × head_dim 2: 16 bytes a token.
fn tiny() -> KvManager {
    let layout = KvLayout::f16(2, 1, 2, 4).unwrap();
    KvManager::new(layout, 4).unwrap()
}

#[test]
fn reserve_returns_the_new_slots() {
    let mut kv = tiny();
    kv.add_sequence(7).unwrap();
    assert_eq!(kv.reserve(7, 5).unwrap()[0], vec![0, 1, 2, 3, 4]);
    assert_eq!(kv.reserve(7, 1).unwrap()[0], vec![5]);
    kv.add_sequence(9).unwrap();
    assert_eq!(kv.reserve(9, 2).unwrap()[0], vec![8, 9]);
    assert_eq!(kv.table(7).unwrap().as_slice(), &[0, 1]);
    assert_eq!(kv.reserve(7, 0).unwrap()[0], Vec::<u32>::new());
    assert_eq!(kv.num_free_blocks(), 1);
    assert_eq!(kv.usage(), 0.75);
    kv.check_integrity().unwrap();
}

#[test]
fn full_cache_says_what_to_do_and_changes_nothing() {
    let mut kv = tiny();
    kv.add_sequence(1).unwrap();
    kv.reserve(1, 10).unwrap();
    assert!(kv.can_allocate(1, 6));
    assert!(!kv.can_allocate(1, 7));
    assert!(kv.can_allocate(2, 4)); // unknown sequence = empty table
    assert!(!kv.can_allocate(2, 5));
    let err = kv.reserve(1, 7).unwrap_err();
    assert_eq!(
        err.to_string(),
        "KV cache is full: need 2 more blocks, 1 free; \
         raise --kv-cache-memory or lower --max-num-seqs / -c"
    );
    assert_eq!(kv.table(1).unwrap().num_tokens(), 10);
    assert_eq!(kv.num_free_blocks(), 1);
    kv.check_integrity().unwrap();
}

#[test]
fn free_returns_blocks_and_ids_are_checked() {
    let mut kv = tiny();
    kv.add_sequence(1).unwrap();
    assert_eq!(kv.add_sequence(1), Err(KvError::SequenceExists(1)));
    assert_eq!(kv.reserve(2, 1), Err(KvError::UnknownSequence(2)));
    kv.reserve(1, 16).unwrap();
    kv.free_sequence(1).unwrap();
    assert_eq!(kv.free_sequence(1), Err(KvError::UnknownSequence(1)));
    assert_eq!(kv.num_free_blocks(), 4);
    assert_eq!(kv.num_sequences(), 0);
    kv.check_integrity().unwrap();
}

#[test]
fn fork_shares_full_blocks_until_the_last_holder_frees() {
    let mut kv = tiny();
    kv.add_sequence(1).unwrap();
    kv.reserve(1, 6).unwrap(); // blocks 0 (full), 1 (partial)
    kv.fork_sequence(1, 2).unwrap();
    assert_eq!(kv.table(2).unwrap().as_slice(), &[0]);
    assert_eq!(kv.reserve(2, 3).unwrap()[0], vec![8, 9, 10]); // child's own block 2
    assert_eq!(kv.fork_sequence(1, 2), Err(KvError::SequenceExists(2)));
    assert_eq!(kv.fork_sequence(5, 6), Err(KvError::UnknownSequence(5)));
    kv.check_integrity().unwrap();
    kv.free_sequence(1).unwrap();
    assert_eq!(kv.pool().ref_count(0), 1);
    assert_eq!(kv.num_free_blocks(), 2);
    kv.free_sequence(2).unwrap();
    assert_eq!(kv.num_free_blocks(), 4);
    kv.check_integrity().unwrap();
}

/// A sliding group (window 6) next to a full one, blocks of 4: each reservation claims a
/// block in both groups; sliding drops the sliding group's blocks behind the window only.
#[test]
fn sliding_groups_roll_their_blocks() {
    let kinds = [GroupKind::Sliding { window: 6 }, GroupKind::Full];
    let groups = KvGroups::from_layer_kinds(&kinds);
    let layout = KvLayout::f16(groups.slots_per_block(), 1, 2, 4).unwrap();
    let sliding = KvGroups::from_layer_kinds(&kinds[..1]); // no full group: no cache
    let err = KvManager::with_groups(layout, sliding, 16, true).unwrap_err();
    assert_eq!(err, KvError::PrefixCacheWithSlidingWindow);
    let mut kv = KvManager::with_groups(layout, groups, 16, false).unwrap();
    assert_eq!(kv.blocks_for_lone_sequence(40, 1), 3 + 10);
    kv.add_sequence(1).unwrap();
    assert_eq!(kv.blocks_needed(1, 5), 4);
    let slots = kv.reserve(1, 5).unwrap();
    assert_eq!(slots, vec![vec![0, 1, 2, 3, 4], vec![8, 9, 10, 11, 12]]);
    assert_eq!(kv.slide_windows(1, 5).unwrap(), 0); // the next query sees 0..=5
    kv.check_integrity().unwrap();
    for pos in 5..40 {
        kv.reserve(1, 1).unwrap();
        kv.slide_windows(1, pos + 1).unwrap();
        kv.check_integrity().unwrap();
        let tables = kv.tables(1).unwrap();
        let first = (pos + 2).saturating_sub(6); // first key of the query at pos + 1
        assert_eq!(tables[0].num_dropped(), first / 4, "at {pos}");
        assert!(
            tables[0].num_live_blocks()
                <= GroupKind::Sliding { window: 6 }.max_live_blocks(4, 1).unwrap()
        );
        assert_eq!(tables[1].num_live_blocks(), (pos + 1).div_ceil(4));
    }
    // 40 tokens: the full group holds 10 blocks, the sliding one 2 (positions 35..=39).
    assert_eq!(kv.num_free_blocks(), 16 - 10 - 2);
    assert_eq!(kv.num_held_blocks(None), 12);
    kv.free_sequence(1).unwrap();
    assert_eq!(kv.num_free_blocks(), 16);
    kv.check_integrity().unwrap();
}

#[test]
fn integrity_catches_a_window_not_slid() {
    let kinds = [GroupKind::Sliding { window: 2 }];
    let groups = KvGroups::from_layer_kinds(&kinds);
    let layout = KvLayout::f16(1, 1, 2, 2).unwrap();
    let mut kv = KvManager::with_groups(layout, groups, 8, false).unwrap();
    kv.add_sequence(1).unwrap();
    kv.reserve(1, 8).unwrap();
    kv.seqs.get_mut(&1).unwrap().slid_to = 8; // claims a slide that dropped nothing
    let err = kv.check_integrity().unwrap_err();
    assert!(err.contains("after sliding to 8"), "{err}");
    kv.slide_windows(1, 8).unwrap();
    kv.check_integrity().unwrap();
    assert_eq!(kv.tables(1).unwrap()[0].num_live_blocks(), 1);
}

#[test]
fn sized_from_a_budget() {
    let smol = KvLayout::f16(30, 3, 64, 16).unwrap();
    let kv = KvManager::from_budget(smol, 1 << 30).unwrap();
    assert_eq!(kv.num_blocks(), (1 << 30) / (16 * 23_040));
    let err = KvManager::from_budget(smol, 368_639).unwrap_err();
    assert!(err.to_string().contains("raise it to at least 368640"));
}

#[test]
fn slots_must_fit_u32() {
    let layout = KvLayout::f16(1, 1, 1, 1024).unwrap();
    assert!(KvManager::new(layout, 1 << 22).is_ok()); // slots 0..2^32
    let err = KvManager::new(layout, (1 << 22) + 1).unwrap_err();
    assert!(matches!(err, KvError::TooManySlots { .. }), "{err}");
}

#[test]
fn integrity_catches_a_leaked_reference() {
    let mut kv = tiny();
    kv.add_sequence(1).unwrap();
    kv.reserve(1, 4).unwrap();
    kv.pool.incref(0); // a reference no table holds
    assert_eq!(
        kv.check_integrity(),
        Err("block 0: 1 holders (tables + prefix cache), ref count 2".into())
    );
}

#[test]
fn integrity_catches_an_unlocked_holder() {
    let layout = KvLayout::f16(2, 1, 2, 4).unwrap();
    let mut kv = KvManager::with_prefix_cache(layout, 4, true).unwrap();
    kv.begin_sequence(1, None, &[1; 4]).unwrap();
    kv.reserve(1, 4).unwrap();
    kv.cache_full_blocks(1, &[1; 4]).unwrap();
    kv.check_integrity().unwrap();
    let mut broken = kv.clone();
    broken.seqs.get_mut(&1).unwrap().locked = None;
    broken.seqs.get_mut(&1).unwrap().num_cached_blocks = 0;
    let err = broken.check_integrity().unwrap_err();
    assert!(err.contains("off its locked path") || err.contains("lock count 1, 0 paths"), "{err}");
}
