//! Runs each fuzz entry point of `fuzz/harness.rs` on pseudo-random
//! inputs, so the harness (and the device's no-panic promise,
//! docs/architecture.md §9) is exercised by every `cargo test`, without
//! nightly or libFuzzer; and replays every reproducer kept in
//! `fuzz/regressions/<target>/`. Inputs are random bytes, and scripts or
//! valid units with random damage, which reach deeper than noise alone.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

#[path = "../fuzz/harness.rs"]
mod harness;

use vt3_iwarp::sim::Rng;
use vt3d::abi::{Cmd, QpState};

fn bytes(rng: &mut Rng, max: usize) -> Vec<u8> {
    let mut out = vec![0u8; rng.below(max as u64 + 1) as usize];
    rng.fill(&mut out);
    out
}

/// Flips, overwrites, truncates or extends `data` at random.
fn damage(rng: &mut Rng, mut data: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.below(4) {
        match rng.below(4) {
            0 if !data.is_empty() => {
                let at = rng.below(data.len() as u64) as usize;
                data[at] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let at = rng.below(data.len() as u64) as usize;
                data[at] = rng.next_u64() as u8;
            }
            2 => data.truncate(rng.below(data.len() as u64 + 1) as usize),
            _ => data.extend(bytes(rng, 8)),
        }
    }
    data
}

/// Writes `control_command` operations the way its decoder reads them.
struct Script(Vec<u8>);

impl Script {
    fn op(&mut self, guest: u8, op: harness::Op) -> &mut Self {
        let index = harness::CONTROL_OPS.iter().position(|o| *o == op).unwrap() as u8;
        self.0.push(guest << 7 | index);
        self
    }

    /// A template command: its argument octets, then "no mutation".
    fn template(&mut self, guest: u8, cmd: Cmd, args: &[u8]) -> &mut Self {
        self.op(guest, harness::Op::Template);
        self.0.push(Cmd::ALL.iter().position(|c| *c == cmd).unwrap() as u8);
        self.0.extend_from_slice(args);
        self.0.push(0);
        self
    }

    fn run(&mut self, ms_by_4: u8) -> &mut Self {
        self.op(0, harness::Op::Run);
        self.0.push(ms_by_4);
        self
    }
}

/// Both guests: address, PD, two CQs, a QP and an MR; B listens, A
/// connects, B accepts the first request.
fn connect_script() -> Vec<u8> {
    let mut s = Script(Vec::new());
    for g in 0..2 {
        s.template(g, Cmd::SetAddr, &[3])
            .template(g, Cmd::AllocPd, &[])
            .template(g, Cmd::CreateCq, &[3])
            .template(g, Cmd::CreateCq, &[3])
            // PD, send CQ, receive CQ, depths 16, 4 SGEs / 64 inline, flags.
            .template(g, Cmd::CreateQp, &[0, 0, 1, 3, 3, 0xe4, 0])
            // PD, 4 pages, full length, all access, not DMA, iova.
            .template(g, Cmd::RegMr, &[0, 3, 0, 7, 0, 1, 0]);
    }
    // PORT, backlog 8.
    s.template(1, Cmd::Listen, &[1, 8]);
    // QP, local port, PORT, no private data, IRD/ORD 8.
    s.template(0, Cmd::Connect, &[0, 1, 0, 0, 8, 8]).run(50);
    // First conn_id, QP, no private data, IRD/ORD 8.
    s.template(1, Cmd::Accept, &[0, 0, 0, 8, 8]).run(50);
    s.0
}

#[test]
fn control_script_reaches_an_established_connection() {
    let world = harness::control_play(&connect_script());
    let rts = QpState::Rts as u32;
    assert_eq!(world.qp_states(), vec![vec![rts], vec![rts]]);
}

#[test]
fn control_command() {
    let mut rng = Rng::new(30);
    let script = connect_script();
    for round in 0..600 {
        let input = match round % 4 {
            0 => bytes(&mut rng, 600),
            1 => damage(&mut rng, script.clone()),
            _ => {
                let mut input = script.clone();
                input.extend(bytes(&mut rng, 400));
                input
            }
        };
        harness::control_command(&input);
    }
}

/// `wqe` input: both guests post receives, A sends (from the no-access
/// MR: a local read needs no right), writes and reads, B sends inline
/// data; time passes and every CQ is reaped.
fn wqe_script() -> Vec<u8> {
    let op = |guest: u8, op: harness::Op| guest << 7 | harness::WQE_OPS.iter().position(|o| *o == op).unwrap() as u8;
    let wr_id = |id: u8| [id, 0, 0, 0, 0, 0, 0, 0];
    let mut s = vec![0x24]; // limits: 4 SGEs each way, 16 inline octets
    for guest in [1, 0] {
        for id in 1..3 {
            // QP, receive, wr_id, 1 SGE: local-write MR, offset id * 4096, 4096 octets.
            s.extend([op(guest, harness::Op::PostWqe), 0, 1]);
            s.extend(wr_id(id));
            s.extend([1, 0, 0, (id - 1) << 4, 0, 0x10]);
        }
    }
    let send = |s: &mut Vec<u8>, guest: u8, opcode: u8, remote_mr: u8, local: [u8; 5]| {
        // QP, send; opcode, signaled; wr_id; remote SGE; invalidate; 1 SGE.
        s.extend([op(guest, harness::Op::PostWqe), 0, 0, opcode, 1]);
        s.extend(wr_id(10 + opcode));
        s.extend([remote_mr, 0x10, 0, 0, 0, 0, 1]);
        s.extend(local);
    };
    send(&mut s, 0, 0, 1, [3, 0, 0, 100, 0]); // SEND 100 octets
    send(&mut s, 0, 4, 1, [0, 0, 0, 0, 2]); // WRITE 512 into B's all-access MR
    send(&mut s, 0, 5, 2, [0, 0, 0x20, 0, 1]); // READ 256 from B's remote-read MR
                                               // B: SEND of 16 inline octets.
    s.extend([op(1, harness::Op::PostWqe), 0, 0, 0, 3]);
    s.extend(wr_id(20));
    s.extend([0, 0, 0, 0, 0, 0, 16]);
    s.extend(*b"sixteen octets!!");
    s.extend([op(0, harness::Op::Run), 25]);
    for guest in [0, 1] {
        for cq in [0, 1] {
            s.extend([op(guest, harness::Op::Reap), cq]);
        }
    }
    s
}

/// Seeds for the campaign (`fuzz/seeds/<target>/`): scripts that reach
/// deep states at once. They must be what the scripts here write (run with
/// VT3_WRITE_FUZZ_SEEDS=1 to rewrite them after a harness change).
#[test]
fn seeds_are_current() {
    let mut control = connect_script();
    // Then traffic, through the same decoder as `wqe`'s post operation.
    let post = harness::CONTROL_OPS.iter().position(|o| *o == harness::Op::PostWqe).unwrap() as u8;
    let wqe = wqe_script();
    control.extend([post | 0x80, 0, 1, 7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0x10]);
    control.extend([post, 0, 0, 0, 1, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 100, 0]);
    control.extend(Script(Vec::new()).run(25).0.clone());
    let relay = {
        let mut m = Vec::new();
        // QEMU's order: GET_FEATURES, SET_OWNER, SET_VRING_ENABLE (NEED_REPLY), SET_FEATURES.
        for (request, flags, payload) in [
            (1u32, 1u32, &[][..]),
            (3, 1, &[]),
            (18, 9, &[0, 0, 0, 0, 1, 0, 0, 0]),
            (2, 1, &[0, 0, 0, 0x40, 1, 0, 0, 0]),
        ] {
            for word in [request, flags, payload.len() as u32] {
                m.extend_from_slice(&word.to_le_bytes());
            }
            m.extend_from_slice(payload);
        }
        let mut input = (m.len() as u16).to_le_bytes().to_vec();
        input.extend(m);
        input
    };
    let seeds = [
        ("control_command", "connect-and-send", control),
        ("wqe", "send-write-read", wqe),
        ("vhost_user_relay", "qemu-order", relay),
    ];
    let root = crate_dir().join("fuzz/seeds");
    for (target, name, bytes) in seeds {
        let path = root.join(target).join(name);
        if std::env::var_os("VT3_WRITE_FUZZ_SEEDS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        assert_eq!(std::fs::read(&path).ok().as_ref(), Some(&bytes), "{} is stale", path.display());
        let run: fn(&[u8]) = match target {
            "control_command" => harness::control_command,
            "wqe" => harness::wqe,
            _ => harness::vhost_user_relay,
        };
        run(&bytes);
    }
}

#[test]
fn wqe_script_moves_data() {
    // A: its SEND, WRITE and READ, and the receive of B's SEND; B: its
    // SEND and the receive of A's. All successful.
    let (mut world, _) = harness::World::connected();
    let wqe = wqe_script();
    let mut input = harness::Input::new(&wqe[1..]);
    world.play(&mut input, &harness::WQE_OPS);
    assert_eq!(world.cqes_reaped(), [(4, 0), (2, 0)]);
}

#[test]
fn wqe() {
    let mut rng = Rng::new(31);
    for _ in 0..150 {
        harness::wqe(&bytes(&mut rng, 1200));
    }
}

#[test]
fn virtio_chains() {
    let mut rng = Rng::new(33);
    for round in 0..3000 {
        let mut input = bytes(&mut rng, 600);
        if round % 2 == 0 && input.len() > 2 {
            // A queue of 8 to 128 entries with all its descriptors used.
            input[0] = (input[0] & !7) | (3 + (input[0] & 3));
            input[1] = 0xff;
        }
        harness::virtio_chains(&input);
    }
}

/// A vhost-user message: SET_FEATURES, SET_VRING_ENABLE or another
/// request, with random flags and payload.
fn vhost_message(rng: &mut Rng) -> Vec<u8> {
    let request: u32 = match rng.below(3) {
        0 => 2,
        1 => 18,
        _ => rng.below(60) as u32,
    };
    let flags = (rng.next_u64() as u32) & 0xf;
    let payload = bytes(rng, 40);
    let mut m = Vec::new();
    for word in [request, flags, payload.len() as u32] {
        m.extend_from_slice(&word.to_le_bytes());
    }
    m.extend(payload);
    m
}

#[test]
fn vhost_user_relay() {
    let mut rng = Rng::new(32);
    for round in 0..3000 {
        let mut front = Vec::new();
        let mut back = Vec::new();
        for _ in 0..rng.below(6) {
            front.extend(vhost_message(&mut rng));
        }
        for _ in 0..rng.below(3) {
            back.extend(vhost_message(&mut rng));
        }
        if round % 3 == 0 {
            front = damage(&mut rng, front);
        }
        if round % 5 == 0 {
            back = bytes(&mut rng, 40);
        }
        let mut input = (front.len() as u16).to_le_bytes().to_vec();
        input.extend(front);
        input.extend(back);
        if round % 7 == 0 {
            input = bytes(&mut rng, 200);
        }
        harness::vhost_user_relay(&input);
    }
}

/// Every file under `fuzz/regressions/<target>/` is an input that once
/// broke `<target>`: it must pass now.
#[test]
fn regressions() {
    let root = crate_dir().join("fuzz/regressions");
    let Ok(targets) = std::fs::read_dir(&root) else { return };
    for target in targets {
        let target = target.unwrap().path();
        let name = target.file_name().unwrap().to_string_lossy().into_owned();
        let run: fn(&[u8]) = match name.as_str() {
            "control_command" => harness::control_command,
            "wqe" => harness::wqe,
            "virtio_chains" => harness::virtio_chains,
            "vhost_user_relay" => harness::vhost_user_relay,
            other => panic!("regressions for an unknown target {other}"),
        };
        for file in std::fs::read_dir(&target).unwrap() {
            let file = file.unwrap().path();
            eprintln!("replaying {}", file.display());
            run(&std::fs::read(&file).unwrap());
        }
    }
}

/// The clone being tested (as in abi_header.rs: cargo names it at run time).
fn crate_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()).into()
}
