//! An idle connection holds no socket buffer page (docs/performance.md,
//! "Round 5 (idle memory)"): the MPA handshake touches one page each way,
//! the TOE gives them back once both buffers stay empty
//! (`TcpConfig::buffer_release`), and data that comes later faults new
//! pages in and arrives intact.

use super::*;

const PAIRS: u32 = 8;

fn resident(sim: &Sim<Node, Node>) -> (usize, usize) {
    (sim.a.engine.toe().tcp().resident_buffer_pages(), sim.b.engine.toe().tcp().resident_buffer_pages())
}

#[test]
fn an_idle_connection_holds_no_buffer_page_after_mpa() {
    let mut sim = connected_pairs(PAIRS);
    // The MPA request, reply and RTR passed through both sides' buffers:
    // at least a receive and a send page per connection and side.
    let (a, b) = resident(&sim);
    assert!(a >= 2 * PAIRS as usize && b >= 2 * PAIRS as usize, "the handshake touched pages: {a}, {b}");
    settle_rtr(&mut sim);
    settle(&mut sim, 1);
    assert_eq!(resident(&sim), (0, 0), "idle connections hold no buffer page");

    // Data flows again through the same buffers (zeroed pages faulted in).
    let (stag, iova) = registered_buffer(&mut sim.b, 8192);
    a_writes_in(&mut sim, (3, PD), stag, iova, 8000);
    let expected: Vec<u8> = (0..8000u32).map(|i| (i % 241) as u8 ^ 0x5a).collect();
    assert_eq!(sim.b.memory.slice(iova, 8000), &expected[..]);
    assert_eq!(results(&sim.a, 3), vec![(1, WcOpcode::Write, WcStatus::Success)]);
    post_recv(&mut sim.b, 105, 50);
    post_send(&mut sim.a, 5, 5, 3000).unwrap();
    assert!(sim
        .run_until(Duration::from_secs(5), |sim| { results(&sim.b, 105).len() == 1 && results(&sim.a, 5).len() == 1 }));
    assert_eq!(results(&sim.b, 105), vec![(50, WcOpcode::Recv, WcStatus::Success)]);
    assert_eq!(results(&sim.a, 5), vec![(5, WcOpcode::Send, WcStatus::Success)]);
    assert!(sim.b.completions.iter().any(|c| c.qpn == 105 && c.byte_len == 3000));

    // And the pages go back again once the connections idle.
    settle(&mut sim, 1);
    assert_eq!(resident(&sim), (0, 0));
    for i in 0..PAIRS {
        assert_eq!(sim.a.state(1 + i), Some(QpState::Rts));
        assert_eq!(sim.b.state(101 + i), Some(QpState::Rts));
    }
}
