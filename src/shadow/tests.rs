use super::*;

fn access(op: u64, p: u32, time: u64, kind: AccessKind, offset: u64, end: u64) -> Arc<Entry> {
    Arc::new(Entry {
        access: Access {
            op,
            time,
            participant: Participant(p),
            kind,
            offset,
            end,
            site: None,
            label: 0,
            captured: 0,
        },
        freed: None,
    })
}

fn listing(ix: &mut Intervals, lo: u64, hi: u64) -> Vec<u64> {
    let mut v = Vec::new();
    ix.visit(lo, hi, |e| {
        v.push(e.access.op);
        Visit::Keep
    });
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn pieces_split_trim_and_merge() {
    let mut ix = Intervals::new();
    ix.insert(0, 100, access(1, 1, 1, AccessKind::Write, 0, 100), |_| {
        false
    });
    ix.insert(40, 60, access(2, 2, 1, AccessKind::Read, 40, 60), |_| false);
    assert_eq!(ix.pieces(), 3);
    assert_eq!(listing(&mut ix, 50, 51), vec![1, 2]);
    assert_eq!(listing(&mut ix, 0, 10), vec![1]);
    // Participant 1 writes [30, 70) again: its earlier write is trimmed there only.
    let dropped = ix.insert(30, 70, access(3, 1, 2, AccessKind::Write, 30, 70), |e| {
        e.access.participant == Participant(1)
    });
    assert_eq!(dropped, 3, "listings of op 1 in [30,40), [40,60), [60,70)");
    assert_eq!(listing(&mut ix, 35, 36), vec![3]);
    assert_eq!(listing(&mut ix, 50, 51), vec![2, 3]);
    assert_eq!(listing(&mut ix, 0, 100), vec![1, 2, 3]);
    assert_eq!(listing(&mut ix, 75, 76), vec![1]);
    // Dropping participant 2 everywhere leaves [0,30) 1, [30,70) 3, [70,100) 1.
    ix.sweep(|e| e.access.participant != Participant(2));
    assert_eq!(ix.pieces(), 3);
    assert_eq!(ix.slots(), 3);
    ix.insert(0, 100, access(4, 1, 3, AccessKind::Write, 0, 100), |_| true);
    assert_eq!((ix.pieces(), ix.slots()), (1, 1));
    assert!(ix.overlaps(99, 1000) && !ix.overlaps(100, 1000));
}

#[test]
fn huge_ranges_cost_no_more_than_small_ones() {
    let mut ix = Intervals::new();
    let base = 1u64 << 47;
    for k in 0..1000u64 {
        ix.insert(
            base,
            base + (1 << 44),
            access(k, 1, k + 1, AccessKind::Write, 0, 1 << 44),
            |e| e.access.op < k,
        );
    }
    assert_eq!((ix.pieces(), ix.slots()), (1, 1));
}
