//! tern-proto driven by the simulator: handshakes and transfers over simulated links.

use std::time::Duration;

use tern_sim::tern::{PairAccess, Transfer};
use tern_sim::LinkConfig;

#[test]
fn ik_and_xx_transfer_over_a_clean_link() {
    for ik in [true, false] {
        let link = LinkConfig::new(10_000_000, Duration::from_millis(10));
        let mut t = Transfer::new(1, link, vec![300_000, 50_000]);
        t.ik = ik;
        let mut sim = t.build();
        let took = sim
            .run_until_done(sim.now() + Duration::from_secs(30))
            .expect("transfer completes");
        assert_eq!(sim.server().app.corrupt, None);
        assert_eq!(sim.server().app.total(), 350_000);
        // 350 kB at 10 Mbit/s is 280 ms; handshake, slow start and the last ACK add a little.
        assert!(took < Duration::from_millis(600), "took {took:?}");
    }
}
