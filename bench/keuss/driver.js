'use strict';
// keuss bucket-mongo-safe contender: one worker speaking bench/worker.py's line protocol
// (argv[2] = spec as JSON; prints {"ready":true}, waits for "go" on stdin, prints {"progress":n} lines,
// ends with one {"result":{...}} line). Roles: fill, push, consume, end_to_end, latency.
// Run by bench/contenders/keuss.py with NODE_PATH pointing at bench/.node/node_modules.

const readline = require('readline');

const spec = JSON.parse(process.argv[2]);
const pad = 'x'.repeat(spec.pad_len || 0);
const PROGRESS_EVERY_MS = 250;
const MAX_LATENCY_SAMPLES = 20000;
const POLL_INTERVAL_MS = 100;  // keuss's default is 60 s: an idle consumer in another process would sleep that long

const now = () => (performance.timeOrigin + performance.now()) / 1000;  // epoch seconds, like time.time()
const cpuS = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
const emit = (obj, then) => process.stdout.write(JSON.stringify(obj) + '\n', then);
// stdout to a pipe is asynchronous: exit only once the last line is out, or a long result line is cut.
const exitAfter = (obj, code) => emit(obj, () => process.exit(code));

const st = {
  count: 0, t0: 0, tLast: 0, tEnd: 0, cpu: 0, cpuSamples: [],  // [time, CPU s] every progress tick
  counting: false, events: [], windows: [],  // commands as [time, name]; they count within the timed windows
  lat: [], progress: null, notes: [],
};

let failed = false;
function fail(err) {
  if (failed) return;
  failed = true;
  const text = (err && err.stack) || (typeof err === 'object' ? JSON.stringify(err) : String(err));
  process.stderr.write(text + '\n');
  exitAfter({result: {error: 'keuss driver: ' + text.split('\n')[0]}}, 1);
}
process.on('uncaughtException', fail);

function onCommand(ev) {
  if (st.counting) st.events.push([now(), ev.commandName]);
}

function go(cb) {
  emit({ready: true});
  const rl = readline.createInterface({input: process.stdin});
  rl.once('line', (line) => {
    rl.close();
    if (line.trim() !== 'go') return fail('orchestrator went away before go');
    st.counting = true;
    st.t0 = st.tLast = now();
    st.cpuSamples.push([st.t0, cpuS()]);
    st.progress = setInterval(() => {
      st.cpuSamples.push([now(), cpuS()]);
      emit({progress: st.count});
    }, PROGRESS_EVERY_MS);
    cb();
  });
}

function mark(n = 1) { st.count += n; st.tLast = now(); }

// The value at time t, linearly between the [time, value] samples around it.
function interpolate(samples, t) {
  const before = samples.filter((s) => s[0] <= t).pop() || samples[0];
  const after = samples.find((s) => s[0] >= t) || samples[samples.length - 1];
  if (after[0] <= before[0]) return before[1];
  return before[1] + (after[1] - before[1]) * (t - before[0]) / (after[0] - before[0]);
}

// Stop the clock now, or at the last completed message (consumers that ended on an idle timeout), so
// that the idle wait counts neither as time, nor as commands, nor as CPU.
function stop(atLastMark) {
  clearInterval(st.progress);
  const t = now();
  st.tEnd = atLastMark ? st.tLast : t;
  st.cpu = interpolate([...st.cpuSamples, [t, cpuS()]], st.tEnd) - st.cpuSamples[0][1];
  st.windows.push([st.t0, st.tEnd]);
}

// Work after stop() that still counts (keuss's drain): its time and commands are added. A drain error is
// noted, not fatal: keuss 2.0.6's drain can race its own periodic state flush and then reports that a
// bucket it deletes was already deleted.
function tail(work, cb) {
  const t = now(), cpu = cpuS();
  work((err) => {
    if (err) st.notes.push('drain reported ' + (err.err || String(err)));
    st.windows.push([t, now()]);
    st.tEnd += now() - t;
    st.cpu += cpuS() - cpu;
    cb();
  });
}

function result() {
  const byName = {};
  let commands = 0;
  for (const [t, name] of st.events) {
    if (st.windows.some(([a, b]) => a <= t && t <= b)) {
      byName[name] = (byName[name] || 0) + 1;
      commands++;
    }
  }
  let lat = st.lat;
  if (lat.length > MAX_LATENCY_SAMPLES) {
    const step = lat.length / MAX_LATENCY_SAMPLES;
    lat = Array.from({length: MAX_LATENCY_SAMPLES}, (_, k) => st.lat[Math.floor(k * step)]);
  }
  return {
    messages: st.count, t_start: st.t0, t_end: st.tEnd, cpu_s: st.cpu,
    peak_rss_mb: process.resourceUsage().maxRSS / 1024, commands: commands, command_names: byName,
    latencies_ms: lat, notes: st.notes.join('; '),
  };
}

function open(cb) {
  const opts = {
    url: spec.url,  // carries monitorCommands=true (and w=...) so that every command is seen
    name: 'bench',
    bucket_max_size: spec.bucket_max_size,
    bucket_max_wait: Math.round(spec.bucket_max_wait_s * 1000),
    reserve_delay: 30,
    state_flush_period: 500,
    pollInterval: POLL_INTERVAL_MS,
    signaller: {provider: require('keuss/signal/local')},
    stats: {provider: require('keuss/stats/mem')},
  };
  require('keuss/backends/bucket-mongo-safe')(opts, (err, factory) => {
    if (err) return fail(err);
    factory._mongo_conn.on('commandStarted', onCommand);
    factory.queue(spec.queue, {}, (err, q) => (err ? fail(err) : cb(factory, q)));
  });
}

// Push n messages with at most spec.window callbacks outstanding. keuss calls back before the write for
// every push but the one that fills a bucket, so callers drain afterwards to make it all durable.
function produce(q, n, counted, done) {
  let sent = 0, acked = 0, outstanding = 0;
  if (n === 0) return done();
  const pump = () => {
    while (outstanding < spec.window && sent < n) {
      const i = sent++;
      outstanding++;
      q.push({ts: now(), i: i, pad: pad}, {}, (err) => {
        if (err) return fail(err);
        outstanding--;
        acked++;
        if (counted) mark();
        if (acked === n) return done();
        pump();
      });
    }
  };
  pump();
}

// spec.concurrency reserve+ok loops, until the producers are done and nothing came for idle_s. The idle
// watch is ours, not pop's timeout: a keuss pop that times out while its read is in flight can still call
// back later with an element. The drain that follows cancels the loops' pending pops.
function consumers(q, producersDone, timedLatency, done) {
  let finished = false;
  const loop = (cid) => q.pop(cid, {reserve: true}, (err, item) => {
    if (finished) return;
    if (err) return fail(err);
    if (timedLatency) st.lat.push((now() - item.payload.ts) * 1000);
    q.ok(item, (err) => {
      if (err) return fail(err);
      mark();
      loop(cid);
    });
  });
  const watch = setInterval(() => {
    if (producersDone() && now() - st.tLast >= spec.idle_s) {
      clearInterval(watch);
      finished = true;
      done();
    }
  }, 20);
  for (let c = 0; c < spec.concurrency; c++) loop('c' + c);
}

// Push n messages one after another, each once the previous one called back, timing each. keuss calls back
// before the write for every push but the one that fills a bucket: these are not durable pushes.
function sequential(q, n, done) {
  let i = 0;
  const next = () => {
    if (i === n) return done();
    const started = performance.now();
    q.push({ts: now(), i: i++, pad: pad}, {}, (err) => {
      if (err) return fail(err);
      st.lat.push(performance.now() - started);
      mark();
      setImmediate(next);
    });
  };
  next();
}

const pushRole = (q, end) => go(() => produce(q, spec.messages, true, () => {
  stop(false);
  tail((cb) => q.drain(cb), end);
}));

const roles = {
  fill: pushRole,
  push: pushRole,
  consume: (q, end) => go(() => consumers(q, () => true, false, () => { stop(true); tail((cb) => q.drain(cb), end); })),
  latency: (q, end) => go(() => sequential(q, spec.messages, () => {
    stop(false);
    tail((cb) => q.drain(cb), end);
  })),
  end_to_end: (q, end) => go(() => {
    let producing = true;
    produce(q, spec.messages, false, () => { producing = false; });
    consumers(q, () => !producing, true, () => { stop(true); tail((cb) => q.drain(cb), end); });
  }),
};

const role = roles[spec.role];
if (!role) fail('keuss driver has no role ' + spec.role);
open((factory, q) => role(q, () => emit({result: result()}, () => {
  setTimeout(() => process.exit(0), 3000).unref();
  factory.close(() => process.exit(0));
})));
