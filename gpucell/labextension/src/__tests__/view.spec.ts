/**
 * The pure view logic: status text, hints, grouping, selection, base64.
 */

import * as fs from 'fs';
import * as path from 'path';

import { Device, ReplyMessage, StateMessage } from '../api';
import {
  NO_CLUSTER,
  NOT_LOADED_HINT,
  Phase,
  base64Utf8,
  groupByHost,
  percent,
  selectionMessage,
  statusText,
  svgDataUri,
  viewModel
} from '../view';

const fixture = JSON.parse(
  fs.readFileSync(
    path.resolve(__dirname, '../../../../tests/fixtures/panel_v1.json'),
    'utf-8'
  )
);
const EMPTY: StateMessage = fixture.valid[0];
const FULL: StateMessage = fixture.valid[1];
const LOCAL: StateMessage = fixture.valid[2];
const REPLY_ERR: ReplyMessage = fixture.valid[4];

const snap = (phase: Phase, state: StateMessage | null = null) => ({
  phase,
  state,
  reply: null
});

function device(engine: number, host: string, selected = true): Device {
  return {
    ...FULL.cluster!.devices[0],
    engine,
    host,
    selected,
    label: `${engine} · ${host}`
  };
}

describe('status text', () => {
  it('is the state’s status when there is a cluster', () => {
    expect(statusText(snap('loaded', FULL))).toBe(FULL.status);
    expect(statusText(snap('loaded', LOCAL))).toBe(LOCAL.status);
  });

  it('is "gpucell: no cluster" otherwise', () => {
    expect(NO_CLUSTER).toBe('gpucell: no cluster');
    expect(statusText(snap('loaded', EMPTY))).toBe(NO_CLUSTER);
    for (const p of [
      'no-notebook',
      'no-kernel',
      'connecting',
      'not-loaded',
      'restarting'
    ] as Phase[]) {
      expect(statusText(snap(p))).toBe(NO_CLUSTER);
      // a state left over from before a restart is not shown
      expect(statusText(snap(p, FULL))).toBe(NO_CLUSTER);
    }
  });
});

describe('the view model', () => {
  it('gives a hint and nothing else when gpucell is not loaded', () => {
    for (const p of ['connecting', 'not-loaded'] as Phase[]) {
      const vm = viewModel(snap(p));
      expect(vm.hint).toBe(NOT_LOADED_HINT);
      expect(vm.hint).toContain('%load_ext gpucell');
      expect(vm.loaded).toBe(false);
      expect(vm.hosts).toEqual([]);
      expect(vm.run).toBeNull();
      expect(vm.seq).toBeNull();
      expect(vm.canStart || vm.canStop).toBe(false);
    }
    expect(viewModel(snap('no-notebook')).hint).toBe('No notebook is active.');
    expect(viewModel(snap('restarting', FULL)).hosts).toEqual([]);
  });

  it('says "no cluster" and offers start when gpucell has none', () => {
    const vm = viewModel(snap('loaded', EMPTY));
    expect(vm.hint).toBeNull();
    expect(vm.connection).toEqual({ text: 'no cluster', hosts: '' });
    expect([vm.canStart, vm.canStop]).toEqual([true, false]);
    expect(vm.seq).toBe(0);
  });

  it('shows a cluster, its devices by host, the run and the last run', () => {
    const vm = viewModel(snap('loaded', FULL));
    expect(vm.seq).toBe(7);
    expect(vm.connection).toEqual({
      text: '4 engines on node1, node2',
      hosts: 'node1, node2'
    });
    expect([vm.canStart, vm.canStop]).toEqual([false, true]);
    expect(vm.hosts.map(g => [g.host, g.devices.map(d => d.engine)])).toEqual([
      ['node1', [0, 1]],
      ['node2', [2]]
    ]);
    const [d0, d1] = vm.hosts[0].devices;
    expect(d0).toMatchObject({
      selected: true,
      state: 'busy',
      color: '#2e7d32',
      utilText: '97%',
      memPct: 25,
      memText: '20.0 / 80.0 GiB',
      extra: '301 W · 61 °C',
      doneText: '12'
    });
    expect(d0.utilPct).toBeCloseTo(97);
    expect(d1).toMatchObject({ selected: false, utilPct: null, memPct: null });
    expect(vm.hosts[1].devices[0]).toMatchObject({ utilPct: 0, memPct: 100 });
    expect(vm.run).toEqual({
      done: 12,
      total: 64,
      status: 'running',
      pct: 18.75,
      text: '12/64 · 0:03 · ETA 0:14'
    });
    expect(vm.last!.lines).toEqual(FULL.last!.lines);
    expect(vm.last!.timelineSrc).toBe(svgDataUri(FULL.last!.timeline_svg!));
    expect(viewModel(snap('loaded', LOCAL)).last!.timelineSrc).toBeNull();
  });

  it('shows the last reply, marked when it failed', () => {
    const vm = viewModel({ phase: 'loaded', state: EMPTY, reply: REPLY_ERR });
    expect(vm.reply).toEqual({
      request: 'start',
      text: REPLY_ERR.text,
      error: true
    });
    expect(
      viewModel({ phase: 'not-loaded', state: null, reply: REPLY_ERR }).reply
    ).toBeNull();
  });

  it('keeps the user’s unconfirmed ticks over the state’s', () => {
    const vm = viewModel({
      phase: 'loaded',
      state: FULL,
      reply: null,
      pending: new Map([
        [0, false],
        [1, true]
      ])
    });
    expect(vm.hosts.flatMap(g => g.devices.map(d => d.selected))).toEqual([
      false,
      true,
      true
    ]);
  });
});

describe('grouping by host', () => {
  it('keeps hosts in first-seen order and devices in theirs', () => {
    const groups = groupByHost([
      device(3, 'b'),
      device(0, 'a'),
      device(1, 'b'),
      device(2, 'a')
    ]);
    expect(groups.map(g => [g.host, g.devices.map(d => d.engine)])).toEqual([
      ['b', [3, 1]],
      ['a', [0, 2]]
    ]);
    expect(groupByHost([])).toEqual([]);
  });
});

describe('the selection message', () => {
  it('is null engines when every device is ticked', () => {
    expect(
      selectionMessage([
        { engine: 0, checked: true },
        { engine: 1, checked: true }
      ])
    ).toEqual({
      v: 1,
      type: 'select',
      engines: null
    });
  });

  it('lists the ticked engines otherwise', () => {
    expect(
      selectionMessage([
        { engine: 0, checked: false },
        { engine: 1, checked: true },
        { engine: 5, checked: true }
      ]).engines
    ).toEqual([1, 5]);
    expect(selectionMessage([{ engine: 0, checked: false }]).engines).toEqual(
      []
    );
  });
});

describe('percent', () => {
  it('clamps fractions to 0-100 and keeps null', () => {
    expect(percent(0.5)).toBe(50);
    expect(percent(2)).toBe(100);
    expect(percent(-1)).toBe(0);
    expect(percent(null)).toBeNull();
    expect(percent(NaN)).toBeNull();
  });
});

describe('base64 of the timeline picture', () => {
  it('encodes UTF-8, which btoa alone cannot', () => {
    const svg = '<svg><text>0 · node1 · 61 °C — ✓</text></svg>';
    expect(() => btoa(svg)).toThrow();
    const b64 = base64Utf8(svg);
    expect(Buffer.from(b64, 'base64').toString('utf-8')).toBe(svg);
    expect(base64Utf8('abc')).toBe(btoa('abc'));
    expect(base64Utf8('')).toBe('');
  });

  it('handles pictures larger than one chunk', () => {
    const svg = '<svg>' + 'é'.repeat(100_000) + '</svg>';
    expect(Buffer.from(base64Utf8(svg), 'base64').toString('utf-8')).toBe(svg);
  });

  it('makes an image data URI', () => {
    expect(svgDataUri('<svg/>')).toBe(
      'data:image/svg+xml;base64,' + Buffer.from('<svg/>').toString('base64')
    );
  });
});
