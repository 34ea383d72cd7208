/**
 * The comm lifecycle against fake kernels: who opens, what a close or a
 * restart does, which comm is live.
 */

import type { Kernel } from '@jupyterlab/services';

import { StateMessage, TARGET, start } from '../api';
import { PanelLink } from '../link';
import { Snapshot, statusText } from '../view';

type Data = unknown;
type Handler = (msg: { content: { data: Data } }) => void;

class FakeComm {
  constructor(
    readonly kernel: FakeKernel,
    readonly commId: string
  ) {}

  isDisposed = false;
  onMsg: Handler = () => undefined;
  onClose: Handler = () => undefined;
  opened: Data[] = [];
  sent: Data[] = [];
  closedByUs = false;

  open(data: Data) {
    this.opened.push(data);
    return { done: Promise.resolve() };
  }

  send(data: Data) {
    if (this.isDisposed) {
      throw new Error('Cannot send');
    }
    this.sent.push(data);
    return { done: Promise.resolve() };
  }

  close() {
    if (this.isDisposed) {
      throw new Error('Cannot close');
    }
    this.closedByUs = true;
    this.onClose({ content: { data: {} } });
    this.isDisposed = true;
    return { done: Promise.reject(new Error('cancelled')) };
  }

  /** the kernel sends a comm_msg */
  deliver(data: Data) {
    this.onMsg({ content: { data } });
  }

  /** the kernel sends a comm_close */
  closeFromKernel() {
    this.onClose({ content: { data: {} } });
    this.isDisposed = true;
  }
}

class FakeKernel {
  constructor(readonly name = 'k') {}

  status: string = 'idle';
  targets: Record<string, (comm: FakeComm, msg: unknown) => void> = {};
  registrations = 0;
  comms: FakeComm[] = [];

  registerCommTarget(
    target: string,
    cb: (comm: FakeComm, msg: unknown) => void
  ) {
    this.registrations += 1;
    this.targets[target] = cb;
  }

  createComm(target: string) {
    expect(target).toBe(TARGET);
    const c = new FakeComm(this, `${this.name}-ours-${this.comms.length}`);
    this.comms.push(c);
    return c;
  }

  /** `%load_ext gpucell`: the kernel opens a comm, a state in its open data */
  openFromKernel(data: Data) {
    const c = new FakeComm(this, `${this.name}-theirs-${this.comms.length}`);
    this.comms.push(c);
    const cb = this.targets[TARGET];
    if (!cb) {
      throw new Error('no target registered');
    }
    cb(c, { content: { comm_id: c.commId, target_name: TARGET, data } });
    return c;
  }

  /** the comms we opened */
  ours() {
    return this.comms.filter(c => c.commId.includes('-ours-'));
  }

  restart() {
    // what KernelConnection does: status 'restarting', comms disposed silently
    this.status = 'restarting';
    for (const c of this.comms) {
      c.isDisposed = true;
    }
  }
}

const asKernel = (k: FakeKernel) => k as unknown as Kernel.IKernelConnection;

function state(
  seq: number,
  engines = [0, 1],
  extra: Partial<StateMessage> = {}
): StateMessage {
  return {
    v: 1,
    type: 'state',
    seq,
    status: `gpucell: ${engines.length} CPU engines · 1 host · – busy`,
    cluster: {
      connection: {
        kind: 'local',
        text: 'local',
        profile: null,
        hosts: ['box']
      },
      selected: null,
      devices: engines.map(e => ({
        engine: e,
        host: 'box',
        label: `${e} · box · CPU`,
        state: 'idle',
        color: '#757575',
        selected: true,
        util: null,
        util_text: '–',
        mem: null,
        mem_text: '–',
        extra: '',
        note: '',
        done_text: ''
      }))
    },
    run: null,
    last: null,
    ...extra
  };
}

function setup() {
  const seen: Snapshot[] = [];
  const link = new PanelLink(s => seen.push(s));
  const last = () => seen[seen.length - 1];
  return { link, seen, last };
}

let warn: jest.SpyInstance;
beforeEach(() => {
  warn = jest.spyOn(console, 'warn').mockImplementation(() => undefined);
});
afterEach(() => warn.mockRestore());

describe('following the active notebook', () => {
  it('knows when there is no notebook or no kernel', () => {
    const { link, last } = setup();
    link.follow(null, false);
    expect(link.snapshot.phase).toBe('no-notebook');
    link.follow(null, true);
    expect(last().phase).toBe('no-kernel');
  });

  it('registers the target and says hello on attaching', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    expect(k.registrations).toBe(1);
    expect(Object.keys(k.targets)).toEqual([TARGET]);
    expect(k.ours()).toHaveLength(1);
    expect(k.ours()[0].opened).toEqual([{ v: 1, type: 'hello' }]);
    expect(last().phase).toBe('connecting');
    expect(statusText(last())).toBe('gpucell: no cluster');
    // following the same kernel again changes nothing
    link.follow(asKernel(k));
    expect(k.ours()).toHaveLength(1);
  });
});

describe('gpucell not loaded, then loaded', () => {
  it('shows the hint when the kernel closes our comm, the state when it opens one', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    k.ours()[0].closeFromKernel(); // ipykernel: no such comm target
    expect(last().phase).toBe('not-loaded');
    expect(link.connected).toBe(false);
    expect(link.send(start(''))).toBe(false);

    const theirs = k.openFromKernel(state(1));
    expect(last().phase).toBe('loaded');
    expect(last().state!.seq).toBe(1);
    expect(statusText(last())).toContain('2 CPU engines');

    theirs.deliver(state(2, [0, 1, 2]));
    expect(last().state!.cluster!.devices).toHaveLength(3);
    expect(link.send(start('-n 2'))).toBe(true);
    expect(theirs.sent).toEqual([{ v: 1, type: 'start', args: '-n 2' }]);
  });

  it('takes the state our hello gets when gpucell is already loaded', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    const ours = k.ours()[0];
    ours.deliver(state(5));
    expect(last().phase).toBe('loaded');
    link.send({ v: 1, type: 'stop' });
    expect(ours.sent).toEqual([{ v: 1, type: 'stop' }]);
  });

  it('ignores a kernel-opened comm without data until it sends a state', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    k.ours()[0].closeFromKernel();
    const theirs = k.openFromKernel({});
    expect(last().phase).toBe('not-loaded');
    theirs.deliver(state(1));
    expect(last().phase).toBe('loaded');
  });

  it('goes back to the hint when gpucell closes the live comm (unloaded)', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    const ours = k.ours()[0];
    ours.deliver(state(1));
    ours.closeFromKernel();
    expect(last().phase).toBe('not-loaded');
    expect(last().state).toBeNull();
    expect(statusText(last())).toBe('gpucell: no cluster');
  });
});

describe('several comms', () => {
  it('makes the comm that delivered the latest state live and closes the older one', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    const ours = k.ours()[0];
    const theirs = k.openFromKernel(state(1));
    expect(last().state!.seq).toBe(1);
    ours.deliver(state(2));
    expect(theirs.closedByUs).toBe(true);
    expect(ours.closedByUs).toBe(false);
    expect(last().phase).toBe('loaded');
    link.send({ v: 1, type: 'stop' });
    expect(ours.sent).toHaveLength(1);
    expect(theirs.sent).toHaveLength(0);
  });
});

describe('invalid messages', () => {
  it('are ignored with a warning, never thrown', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    const ours = k.ours()[0];
    ours.deliver(state(1));
    for (const bad of [
      null,
      [1],
      { v: 2, type: 'state' },
      { v: 1, type: 'state', seq: 2 },
      'x'
    ]) {
      expect(() => ours.deliver(bad)).not.toThrow();
    }
    // a panel-to-kernel message from the kernel: valid, but not for us
    ours.deliver({ v: 1, type: 'hello' });
    expect(warn).toHaveBeenCalledTimes(6);
    expect(last().state!.seq).toBe(1);
    expect(last().phase).toBe('loaded');
  });

  it('an invalid state in the open data leaves the hint', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    k.ours()[0].closeFromKernel();
    k.openFromKernel({ v: 1, type: 'state' });
    expect(warn).toHaveBeenCalledTimes(1);
    expect(last().phase).toBe('not-loaded');
  });

  it('a view that throws does not break the link', () => {
    const link = new PanelLink(() => {
      throw new Error('boom');
    });
    const k = new FakeKernel();
    expect(() => link.follow(asKernel(k))).not.toThrow();
    expect(warn).toHaveBeenCalled();
  });

  it('a kernel without comms gives the hint', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    k.createComm = () => {
      throw new Error('Comms are disabled on this kernel connection');
    };
    link.follow(asKernel(k));
    expect(last().phase).toBe('not-loaded');
  });
});

describe('kernel restarts', () => {
  it('drops the state at once and attaches again when the kernel is back', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    const ours = k.ours()[0];
    ours.deliver(state(9));
    expect(last().phase).toBe('loaded');

    k.restart();
    link.status('restarting');
    expect(last().phase).toBe('restarting');
    expect(last().state).toBeNull();
    expect(statusText(last())).toBe('gpucell: no cluster');
    ours.deliver(state(10)); // a late message of the old kernel
    expect(last().state).toBeNull();

    link.status('starting');
    expect(k.ours()).toHaveLength(1);
    k.status = 'idle';
    link.status('idle');
    expect(k.registrations).toBe(2);
    expect(k.ours()).toHaveLength(2);
    expect(k.ours()[1].opened).toEqual([{ v: 1, type: 'hello' }]);
    expect(last().phase).toBe('connecting');
    k.ours()[1].closeFromKernel();
    expect(last().phase).toBe('not-loaded');

    // the new kernel runs %load_ext gpucell: it opens a comm to us
    k.openFromKernel(state(1));
    expect(last().phase).toBe('loaded');
    expect(last().state!.seq).toBe(1);
  });

  it('treats autorestarting and dead alike', () => {
    for (const s of ['autorestarting', 'dead']) {
      const { link, last } = setup();
      const k = new FakeKernel();
      link.follow(asKernel(k));
      k.ours()[0].deliver(state(1));
      link.status(s);
      expect(last().phase).toBe('restarting');
      expect(last().state).toBeNull();
    }
  });

  it('waits for a kernel found restarting', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    k.status = 'restarting';
    link.follow(asKernel(k));
    expect(last().phase).toBe('restarting');
    expect(k.ours()).toHaveLength(0);
    link.status('idle');
    expect(k.ours()).toHaveLength(1);
  });

  it('accepts a comm the kernel opens before we saw it idle', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    link.status('restarting');
    k.openFromKernel(state(1));
    expect(last().phase).toBe('loaded');
    link.status('idle');
    expect(k.ours()).toHaveLength(1); // no second hello needed
  });
});

describe('switching kernels', () => {
  it('closes the old kernel’s comms and refuses its later ones', () => {
    const { link, last } = setup();
    const a = new FakeKernel('a');
    const b = new FakeKernel('b');
    link.follow(asKernel(a));
    const oursA = a.ours()[0];
    oursA.deliver(state(1));
    link.follow(asKernel(b));
    expect(oursA.closedByUs).toBe(true);
    expect(last().phase).toBe('connecting');
    expect(last().state).toBeNull();
    const late = a.openFromKernel(state(2));
    expect(late.closedByUs).toBe(true);
    expect(last().phase).toBe('connecting');
    b.ours()[0].deliver(state(1, [0]));
    expect(last().state!.cluster!.devices).toHaveLength(1);
    link.follow(null, false);
    expect(last().phase).toBe('no-notebook');
    expect(b.ours()[0].closedByUs).toBe(true);
  });
});

describe('selection', () => {
  it('sends the ticks and shows them until the kernel replies', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    const ours = k.ours()[0];
    ours.deliver(state(1));
    expect(
      link.select([
        { engine: 0, checked: false },
        { engine: 1, checked: true }
      ])
    ).toBe(true);
    expect(ours.sent).toEqual([{ v: 1, type: 'select', engines: [1] }]);
    expect(last().pending!.get(0)).toBe(false);
    ours.deliver(state(2)); // a state sent before the kernel saw the request
    expect(last().pending).not.toBeNull();
    ours.deliver({
      v: 1,
      type: 'reply',
      request: 'select',
      ok: true,
      text: 'engines [1]'
    });
    expect(last().pending).toBeNull();
    expect(last().reply!.text).toBe('engines [1]');

    link.select([
      { engine: 0, checked: true },
      { engine: 1, checked: true }
    ]);
    expect(ours.sent[1]).toEqual({ v: 1, type: 'select', engines: null });
    // a state showing the ticks confirms them too
    ours.deliver(state(3));
    expect(last().pending).toBeNull();
  });

  it('sends nothing without a live comm', () => {
    const { link } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    expect(link.select([{ engine: 0, checked: true }])).toBe(false);
  });
});

describe('retry', () => {
  it('says hello again only when gpucell did not answer', () => {
    const { link, last } = setup();
    const k = new FakeKernel();
    link.follow(asKernel(k));
    link.retry(); // still connecting: nothing
    expect(k.ours()).toHaveLength(1);
    k.ours()[0].closeFromKernel();
    link.retry();
    expect(k.ours()).toHaveLength(2);
    expect(last().phase).toBe('connecting');
    k.ours()[1].deliver(state(1));
    link.retry(); // loaded: nothing
    expect(k.ours()).toHaveLength(2);
    link.status('restarting');
    link.retry(); // restarting: wait for the kernel
    expect(k.ours()).toHaveLength(2);
  });
});
