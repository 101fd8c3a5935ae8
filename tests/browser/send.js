// Sends `count` rounds of every call type with one SDK, each event marked with the run id and its
// number, so the test finds each in the collector's log. Sets window.done (or window.failed).
(async () => {
  const p = window.sdkParams;
  const count = Number(p.count || 5);
  const mark = (kind, n) => ({ run: p.run, n: `${kind}-${n}`, nested: { list: [1, "two", null] } });
  const sent = [];
  try {
    if (p.sdk === "segment") {
      const strategy =
        p.mode === "batching"
          ? { strategy: "batching", config: { size: 7, timeout: 300 } }
          : { strategy: "standard" };
      const [analytics] = await AnalyticsNext.AnalyticsBrowser.load(
        { writeKey: p.key, cdnURL: p.collector },
        { integrations: { "Segment.io": { deliveryStrategy: strategy } } },
      );
      const calls = [];
      for (let n = 0; n < count; n++) {
        calls.push(analytics.track("Clicked", mark("track", n)));
        calls.push(analytics.page("Docs", `Page ${n}`, mark("page", n)));
        calls.push(analytics.identify(`user-${p.run}`, mark("identify", n)));
        calls.push(analytics.group(`group-${n}`, mark("group", n)));
        calls.push(analytics.alias(`user-${p.run}`, `anon-${p.run}-${n}`));
      }
      for (const ctx of await Promise.all(calls)) {
        if (ctx.failedDelivery()) throw new Error(`not delivered: ${ctx.failedDelivery().reason}`);
        sent.push(ctx.event.messageId);
      }
    } else {
      const ra = new rudderanalytics.RudderAnalytics();
      const loaded = new Promise((resolve) => {
        ra.load(p.key, p.collector, {
          configUrl: p.collector,
          useBeacon: p.mode === "beacon",
          beaconQueueOptions: { flushQueueInterval: 300 },
          logLevel: "WARN",
          onLoaded: resolve,
        });
      });
      await loaded;
      for (let n = 0; n < count; n++) {
        ra.track("Clicked", mark("track", n));
        ra.page("Docs", `Page ${n}`, mark("page", n));
        ra.identify(`user-${p.run}`, mark("identify", n));
        ra.group(`group-${n}`, mark("group", n));
        ra.alias(`user-${p.run}`, `anon-${p.run}-${n}`);
      }
    }
    window.done = sent;
  } catch (error) {
    window.failed = String(error && error.stack || error);
  }
})();
