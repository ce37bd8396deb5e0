package io.github.kafkatieredsidecar.plugin;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

class ReadOvershootTest {

    @Test
    void noReadsNoHeadroom() {
        assertEquals(0, new ReadOvershoot().headroom());
    }

    @Test
    void theLargestRecentOvershootRoundedUp() {
        ReadOvershoot overshoot = new ReadOvershoot();
        overshoot.record(5_000);
        overshoot.record(-300);
        overshoot.record(ReadOvershoot.ROUND_BYTES + 1);
        overshoot.record(0);
        assertEquals(2 * ReadOvershoot.ROUND_BYTES, overshoot.headroom());
    }

    @Test
    void anOldOvershootIsForgottenAndALargeOneCapped() {
        ReadOvershoot overshoot = new ReadOvershoot();
        overshoot.record(10L * ReadOvershoot.MAX_BYTES);
        assertEquals(ReadOvershoot.MAX_BYTES, overshoot.headroom());
        for (int i = 0; i < ReadOvershoot.REMEMBERED - 1; i++) {
            overshoot.record(1);
        }
        assertEquals(ReadOvershoot.MAX_BYTES, overshoot.headroom(), "still among the last reads");
        overshoot.record(1);
        assertEquals(ReadOvershoot.ROUND_BYTES, overshoot.headroom());
    }
}
