//! SRQ resize (VT3_CMD_RESIZE_SRQ, docs/architecture.md §3.4):
//! the WQEs posted, fetched or taken before it complete once, in order,
//! after it; the old ring is not read again; hostile resizes are refused
//! and leave the SRQ as it was.

use super::*;

/// What vt3.ko and libvt3 do around a resize.
trait Resize {
    fn resize_srq(&mut self, srq: &mut SrqRing, depth: u32) -> Result<(), Status>;
    fn post_srq_quietly(&mut self, srq: &mut SrqRing, wqe: RqWqe);
    fn srq_attr(&mut self, srqn: u32) -> SrqAttr;
}

impl Resize for Guest {
    /// As vt3.ko does: a new ring of `depth`, every WQE of [prod - old
    /// depth, prod) copied to it at its index, then RESIZE_SRQ. Once
    /// vt3d answered, the old ring is scribbled over: vt3d must not read
    /// it any more.
    fn resize_srq(&mut self, srq: &mut SrqRing, depth: u32) -> Result<(), Status> {
        let npages = (depth * 128).div_ceil(PAGE as u32);
        let (pbl, ring) = self.ram.pages(npages);
        for i in 0..srq.depth {
            let idx = srq.prod.wrapping_sub(srq.depth).wrapping_add(i);
            let wqe: RqWqe =
                self.ram.mem.read_obj(GuestAddress(srq.ring + u64::from(idx & (srq.depth - 1)) * 128)).unwrap();
            self.ram.mem.write_obj(wqe, GuestAddress(ring + u64::from(idx & (depth - 1)) * 128)).unwrap();
        }
        let a = CmdResizeSrq {
            ring_pbl_addr: pbl.into(),
            ring_npages: npages.into(),
            depth: depth.into(),
            srqn: srq.srqn.into(),
            reserved: 0.into(),
        };
        self.cmd(Cmd::ResizeSrq, &a)?;
        self.ram.write_bytes(srq.ring, &vec![0xff; srq.depth as usize * 128]);
        srq.ring = ring;
        srq.depth = depth;
        Ok(())
    }

    /// A WQE in the ring and the producer index, without a doorbell.
    fn post_srq_quietly(&mut self, srq: &mut SrqRing, wqe: RqWqe) {
        let slot = u64::from(srq.prod & (srq.depth - 1));
        self.ram.mem.write_obj(wqe, GuestAddress(srq.ring + slot * 128)).unwrap();
        srq.prod = srq.prod.wrapping_add(1);
        self.ram.mem.store(srq.prod.to_le(), GuestAddress(srq.status), Ordering::Release).unwrap();
    }

    fn srq_attr(&mut self, srqn: u32) -> SrqAttr {
        let h = CmdHandle { handle: srqn.into(), reserved: 0.into() };
        read_struct::<SrqAttr>(&self.cmd(Cmd::QuerySrq, &h).unwrap()).unwrap()
    }
}

fn pooled(s: &SrqSetup) -> Option<usize> {
    s.sim.b.dev.rnic.offload().unwrap().engine().srq_pooled(s.srq.srqn)
}

#[test]
fn a_resize_keeps_every_wqe_taken_fetched_or_posted() {
    let mut s = srq_setup(0);
    let (q0, q1) = (s.qb[0].qpn, s.qb[1].qpn);
    s.post(6);
    assert_eq!(summary(&s.send_and_reap(0, 3000)), (q0, 100, 0, 0, SRQ_FLAG));
    // QP 1 takes WQE 1 for a message of many segments, still arriving.
    s.send(1, 1, 60_000);
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.b.srq_status(&s.srq).cons.to_native() == 2));
    assert_eq!(s.sim.b.cq_status(&s.rcq).prod.to_native(), 1, "the message is still being received");
    // Two more in the ring, not fetched (no doorbell): 2..=5 are pooled.
    for i in 6..8 {
        let wqe = recv_wqe(100 + i, &s.b_buf, (i % 8) * 65536, 65536);
        s.sim.b.post_srq_quietly(&mut s.srq, wqe);
    }
    assert_eq!(pooled(&s), Some(4));
    let now = s.sim.now;
    let mut srq = s.srq;
    s.sim.b.at(now).resize_srq(&mut srq, 32).unwrap();
    s.srq = srq;
    assert_eq!(s.sim.b.at(now).srq_attr(s.srq.srqn).depth.to_native(), 32);
    // 20 more: 26 posted and not taken, more than the old ring held.
    s.post(20);
    s.sim.run_for(Duration::from_millis(1));
    assert_eq!(pooled(&s), Some(26), "the pool grew with the ring");
    // The message taken before the resize completes once, on QP 1.
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.b.cq_status(&s.rcq).prod.to_native() == 2));
    let mut rcq = s.rcq;
    let cqes = s.sim.b.poll_cq(&mut rcq);
    s.rcq = rcq;
    assert_eq!(cqes.iter().map(summary).collect::<Vec<_>>(), vec![(q1, 101, 1, 0, SRQ_FLAG)]);
    assert_eq!(cqes[0].byte_len.to_native(), 60_000);
    assert_eq!(s.sim.b.ram.read_bytes(s.b_buf.guest + 65536, 60_000), s.sim.a.ram.read_bytes(s.a_buf.guest, 60_000));
    // Then every other WQE, once, in SRQ order, with its data.
    for idx in 2..28u32 {
        let i = (idx % 2) as usize;
        let c = s.send_and_reap(i, 1000 + idx);
        assert_eq!(summary(&c), (s.qb[i].qpn, 100 + u64::from(idx), idx, 0, SRQ_FLAG));
        let at = s.b_buf.guest + u64::from(idx % 8) * 65536;
        assert_eq!(
            s.sim.b.ram.read_bytes(at, (1000 + idx) as usize),
            s.sim.a.ram.read_bytes(s.a_buf.guest, (1000 + idx) as usize)
        );
    }
    let st = s.sim.b.srq_status(&s.srq);
    assert_eq!((st.prod.to_native(), st.cons.to_native()), (28, 28));
    assert_eq!(pooled(&s), Some(0));
    assert_eq!(st.flags.to_native() & SrqStatusFlag::Error as u32, 0);
    assert!(s.sim.b.qp_events().is_empty(), "no QP failed: {:?}", s.sim.b.qp_events());
}

#[test]
fn hostile_resizes_are_refused_and_change_nothing() {
    let mut s = srq_setup(2);
    s.post(3);
    let now = s.sim.now;
    let b = &mut s.sim.b;
    let (pbl, _) = b.ram.pages(2);
    let good = CmdResizeSrq {
        ring_pbl_addr: pbl.into(),
        ring_npages: 2.into(),
        depth: 16.into(),
        srqn: s.srq.srqn.into(),
        reserved: 0.into(),
    };
    let cases = [
        (CmdResizeSrq { depth: 4.into(), ring_npages: 1.into(), ..good }, Status::Invalid), // smaller
        (CmdResizeSrq { depth: 24.into(), ..good }, Status::Invalid),                       // not a power of two
        (CmdResizeSrq { depth: 8192.into(), ring_npages: 256.into(), ..good }, Status::Invalid), // above max_srq_wr
        (CmdResizeSrq { depth: 128.into(), ..good }, Status::Invalid),                      // more than 2 pages hold
        (CmdResizeSrq { ring_npages: 0.into(), ..good }, Status::Invalid),
        (CmdResizeSrq { ring_npages: 1_000_000.into(), ..good }, Status::BadAddress), // a list past the end of RAM
        (CmdResizeSrq { reserved: 1.into(), ..good }, Status::Invalid),
        (CmdResizeSrq { srqn: 99.into(), ..good }, Status::NotFound),
        (CmdResizeSrq { ring_pbl_addr: (MEM as u64 - 8).into(), ..good }, Status::BadAddress),
    ];
    for (args, want) in cases {
        assert_eq!(b.at(now).cmd(Cmd::ResizeSrq, &args), Err(want), "{args:?}");
    }
    // A page list naming memory outside the guest.
    b.ram.mem.write_obj((MEM as u64).to_le(), GuestAddress(pbl + 8)).unwrap();
    assert_eq!(b.at(now).cmd(Cmd::ResizeSrq, &good), Err(Status::BadAddress));
    // Nothing changed: depth, limit, the WQEs, the limit event.
    let attr = b.at(now).srq_attr(s.srq.srqn);
    assert_eq!((attr.depth.to_native(), attr.limit.to_native(), attr.armed.to_native()), (8, 2, 1));
    let (q0, q1) = (s.qb[0].qpn, s.qb[1].qpn);
    assert_eq!(summary(&s.send_and_reap(0, 100)), (q0, 100, 0, 0, SRQ_FLAG));
    assert_eq!(summary(&s.send_and_reap(1, 100)), (q1, 101, 1, 0, SRQ_FLAG));
    assert_eq!(s.sim.b.events.handles(EventType::SrqLimit), vec![s.srq.srqn]);
    // A broken SRQ is not resized.
    let now = s.sim.now;
    s.srq.prod = s.srq.prod.wrapping_add(s.srq.depth + 1);
    s.sim.b.at(now).srq_doorbell(&s.srq);
    s.sim.run_for(Duration::from_millis(1));
    assert_eq!(s.sim.b.events.handles(EventType::SrqError), vec![s.srq.srqn]);
    let now = s.sim.now;
    let (pbl, _) = s.sim.b.ram.pages(4);
    let grow = CmdResizeSrq { ring_pbl_addr: pbl.into(), ring_npages: 4.into(), depth: 32.into(), ..good };
    assert_eq!(s.sim.b.at(now).cmd(Cmd::ResizeSrq, &grow), Err(Status::Invalid));
}

#[test]
fn a_resize_keeps_the_limit_and_its_event() {
    let mut s = srq_setup(3);
    s.post(4);
    let now = s.sim.now;
    let mut srq = s.srq;
    s.sim.b.at(now).resize_srq(&mut srq, 16).unwrap();
    s.srq = srq;
    let attr = s.sim.b.at(now).srq_attr(s.srq.srqn);
    assert_eq!(
        (attr.depth.to_native(), attr.limit.to_native(), attr.armed.to_native(), attr.qps.to_native()),
        (16, 3, 1, 2)
    );
    s.send_and_reap(0, 100); // 3 left
    assert!(s.sim.b.events.handles(EventType::SrqLimit).is_empty());
    s.send_and_reap(1, 100); // 2 left: below the limit
    assert_eq!(s.sim.b.events.handles(EventType::SrqLimit), vec![s.srq.srqn]);
    // A limit up to the new depth is accepted now.
    let m = CmdModifySrq {
        srqn: s.srq.srqn.into(),
        mask: (SrqModifyMask::Limit as u32).into(),
        limit: 16.into(),
        reserved: 0.into(),
    };
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::ModifySrq, &m).unwrap();
}
