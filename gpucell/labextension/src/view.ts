/**
 * What the panel and the status bar show, computed from the comm's messages.
 *
 * Pure functions (no DOM, no Jupyter) so jest checks them without a browser;
 * `panel.ts` only copies a {@link ViewModel} into elements.
 */

import {
  Background,
  Device,
  DeviceState,
  ReplyMessage,
  RunStatus,
  SelectMessage,
  StateMessage,
  select
} from './api';
import { LegendEntry, historyCharts, spanText } from './charts';

/** The status-bar text whenever there is no gpucell cluster to describe. */
export const NO_CLUSTER = 'gpucell: no cluster';

/**
 * Where the panel stands with the active notebook's kernel.
 *
 * - `no-notebook`: no notebook is active;
 * - `no-kernel`: the active notebook has no kernel (yet);
 * - `connecting`: our comm is open but gpucell has not answered yet;
 * - `not-loaded`: the kernel closed our comm (gpucell is not loaded in it);
 * - `restarting`: the kernel is restarting or dead;
 * - `loaded`: gpucell sent a valid state.
 */
export type Phase =
  | 'no-notebook'
  | 'no-kernel'
  | 'connecting'
  | 'not-loaded'
  | 'restarting'
  | 'loaded';

/** Everything the views are computed from. */
export interface Snapshot {
  phase: Phase;
  /** the latest valid state (only meaningful when phase is `loaded`) */
  state: StateMessage | null;
  /** the latest reply to one of our requests */
  reply: ReplyMessage | null;
  /**
   * ticks the user changed that the kernel has not confirmed yet (engine ->
   * ticked); they win over the state's until the `select` reply arrives
   */
  pending?: ReadonlyMap<number, boolean> | null;
}

export const NOT_LOADED_HINT =
  "gpucell is not loaded in this notebook's kernel: run %load_ext gpucell";

export interface DeviceView {
  engine: number;
  label: string;
  state: DeviceState;
  /** what the state means, for the badge's tooltip ('' when it says it all) */
  stateTitle: string;
  color: string;
  selected: boolean;
  /** bar width in percent, 0-100; null: not measured */
  utilPct: number | null;
  utilText: string;
  memPct: number | null;
  memText: string;
  extra: string;
  note: string;
  doneText: string;
}

export interface HostGroup {
  host: string;
  devices: DeviceView[];
}

export interface RunView {
  done: number;
  total: number;
  status: RunStatus;
  /** progress bar width in percent, 0-100 */
  pct: number;
  text: string;
}

export interface LastView {
  id: number;
  status: string;
  lines: string[];
  /** a `data:image/svg+xml;base64,...` URI, or null when there is no picture */
  timelineSrc: string | null;
}

export interface ChartView {
  /** a `data:image/svg+xml;base64,...` URI */
  src: string;
  /** measured points drawn */
  points: number;
}

export interface ChartsView {
  /** "last 5 min"; "last 15 s (of 5 min)" while the history fills */
  title: string;
  /** seconds the x axis spans */
  span: number;
  util: ChartView;
  mem: ChartView;
  legend: LegendEntry[];
}

export interface BackgroundRunView {
  cell: number;
  state: string;
  /** progress bar width in percent, 0-100 */
  pct: number;
  /** "cell [5]: 37 of 120 iterations (30%), 12.3 s, running" */
  text: string;
  /** "writes out, total": a later cell that uses one waits for the run */
  writes: string;
  /** "started 10:42:03" (the browser's local time) */
  started: string;
  note: string;
}

export interface BackgroundEndView {
  cell: number;
  outcome: string;
  text: string;
  error: boolean;
}

export interface BackgroundView {
  /** "1 background run": the section's title */
  title: string;
  pending: BackgroundRunView[];
  recent: BackgroundEndView[];
}

export interface ReplyView {
  request: string;
  text: string;
  error: boolean;
}

export interface ViewModel {
  /** the state's seq, or null when there is no gpucell state */
  seq: number | null;
  /** the status-bar text */
  status: string;
  /** the hint shown instead of the cluster when gpucell is not in the kernel */
  hint: string | null;
  /** gpucell answered: connection, controls and devices are shown */
  loaded: boolean;
  connection: { text: string; hosts: string } | null;
  canStart: boolean;
  canStop: boolean;
  hosts: HostGroup[];
  run: RunView | null;
  last: LastView | null;
  /** utilisation and memory over time; null without a cluster or history */
  charts: ChartsView | null;
  /** `--background` runs: pending and recent; null when there are none */
  background: BackgroundView | null;
  reply: ReplyView | null;
}

/** The status-bar text: the state's own, or {@link NO_CLUSTER}. */
export function statusText(s: Snapshot): string {
  if (s.phase === 'loaded' && s.state && s.state.cluster) {
    return s.state.status;
  }
  return NO_CLUSTER;
}

/** The panel's hint for a phase (null: gpucell is there, no hint). */
export function hintText(phase: Phase): string | null {
  switch (phase) {
    case 'no-notebook':
      return 'No notebook is active.';
    case 'no-kernel':
      return 'This notebook has no kernel.';
    case 'restarting':
      return (
        'The kernel is restarting (or has died): gpucell is not loaded in it; ' +
        'run %load_ext gpucell once it is back.'
      );
    case 'connecting':
    case 'not-loaded':
      return NOT_LOADED_HINT;
    default:
      return null;
  }
}

/** A fraction as a bar width in percent, clamped to 0-100 (null stays null). */
export function percent(fraction: number | null): number | null {
  if (fraction === null || !Number.isFinite(fraction)) {
    return null;
  }
  return Math.min(1, Math.max(0, fraction)) * 100;
}

/** The tooltip of a device's state badge ('' for the plain states). */
export function stateTitle(state: DeviceState): string {
  switch (state) {
    case 'restarting':
      return (
        'its engine died; a new engine is being started on this device ' +
        'and takes over this row'
      );
    case 'dead':
      return 'its engine died and nothing restarts it';
    case 'retrying':
      return 'running chunks that were lost once';
    default:
      return '';
  }
}

export function deviceView(d: Device, selected?: boolean): DeviceView {
  return {
    engine: d.engine,
    label: d.label,
    state: d.state,
    stateTitle: stateTitle(d.state),
    color: d.color,
    selected: selected ?? d.selected,
    utilPct: percent(d.util),
    utilText: d.util_text,
    memPct: percent(d.mem),
    memText: d.mem_text,
    extra: d.extra,
    note: d.note,
    doneText: d.done_text
  };
}

/**
 * Devices grouped by host, hosts in the order they first appear, devices in
 * their given order.  `pending`: ticks the user changed that the kernel has
 * not confirmed yet (they win over the state's).
 */
export function groupByHost(
  devices: Device[],
  pending: ReadonlyMap<number, boolean> | null = null
): HostGroup[] {
  const groups = new Map<string, HostGroup>();
  for (const d of devices) {
    let g = groups.get(d.host);
    if (!g) {
      g = { host: d.host, devices: [] };
      groups.set(d.host, g);
    }
    g.devices.push(deviceView(d, pending?.get(d.engine)));
  }
  return [...groups.values()];
}

/** The `select` request for the panel's ticks: null engines when all are ticked. */
export function selectionMessage(
  ticks: ReadonlyArray<{ engine: number; checked: boolean }>
): SelectMessage {
  if (ticks.length > 0 && ticks.every(t => t.checked)) {
    return select(null);
  }
  return select(ticks.filter(t => t.checked).map(t => t.engine));
}

/** Base64 of a string's UTF-8 bytes (btoa alone only takes Latin-1). */
export function base64Utf8(text: string): string {
  const bytes = new TextEncoder().encode(text);
  let binary = '';
  const CHUNK = 0x8000;
  for (let i = 0; i < bytes.length; i += CHUNK) {
    binary += String.fromCharCode(...bytes.subarray(i, i + CHUNK));
  }
  return btoa(binary);
}

/** An SVG document as an image URI (shown in an <img>: no script in it runs). */
export function svgDataUri(svg: string): string {
  return 'data:image/svg+xml;base64,' + base64Utf8(svg);
}

/** The charts of a state with a cluster and a history (else null). */
export function chartsView(state: StateMessage | null): ChartsView | null {
  const h = state?.history ?? null;
  if (!state?.cluster || !h || h.devices.length === 0) {
    return null;
  }
  const labels = new Map(state.cluster.devices.map(d => [d.engine, d.label]));
  const c = historyCharts(h, labels);
  const minutes = h.window / 60;
  const full = Number.isInteger(minutes)
    ? `${minutes} min`
    : `${Math.round(h.window)} s`;
  return {
    title:
      c.span < h.window
        ? `last ${spanText(c.span)} (of ${full})`
        : `last ${full}`,
    span: c.span,
    util: { src: svgDataUri(c.util.svg), points: c.util.points },
    mem: { src: svgDataUri(c.mem.svg), points: c.mem.points },
    legend: c.legend
  };
}

function two(n: number): string {
  return String(n).padStart(2, '0');
}

/** "10:42:03": epoch seconds as the browser's local time of day. */
export function clockText(epochSeconds: number): string {
  const d = new Date(epochSeconds * 1000);
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

/** The background runs of a state (null: none pending or recent). */
export function backgroundView(
  b: Background | null | undefined
): BackgroundView | null {
  if (!b || (b.pending.length === 0 && b.recent.length === 0)) {
    return null;
  }
  const n = b.pending.length;
  return {
    title:
      n === 0
        ? 'Background runs'
        : `${n} background run${n === 1 ? '' : 's'} pending`,
    pending: b.pending.map(p => ({
      cell: p.cell,
      state: p.state,
      pct:
        p.total > 0
          ? (percent(p.done / p.total) ?? 0)
          : p.state === 'running'
            ? 0
            : 100,
      text: p.text,
      writes: p.writes.length ? `writes ${p.writes.join(', ')}` : '',
      started: `started ${clockText(p.started_at)}`,
      note: p.note
    })),
    recent: b.recent.map(r => ({
      cell: r.cell,
      outcome: r.outcome,
      text: r.text,
      error: r.outcome === 'failed'
    }))
  };
}

/** The whole view from a snapshot. */
export function viewModel(s: Snapshot): ViewModel {
  const loaded = s.phase === 'loaded' && s.state !== null;
  const state = loaded ? s.state : null;
  const cluster = state?.cluster ?? null;
  const run = state?.run ?? null;
  const last = state?.last ?? null;
  return {
    seq: state ? state.seq : null,
    status: statusText(s),
    hint: loaded ? null : (hintText(s.phase) ?? NOT_LOADED_HINT),
    loaded,
    connection: !loaded
      ? null
      : cluster
        ? {
            text: cluster.connection.text,
            hosts: cluster.connection.hosts.join(', ')
          }
        : { text: 'no cluster', hosts: '' },
    canStart: loaded && cluster === null,
    canStop: loaded && cluster !== null,
    hosts: cluster ? groupByHost(cluster.devices, s.pending ?? null) : [],
    run: run
      ? {
          done: run.done,
          total: run.total,
          status: run.status,
          pct:
            run.total > 0
              ? (percent(run.done / run.total) ?? 0)
              : run.status === 'running'
                ? 0
                : 100,
          text: run.text
        }
      : null,
    last: last
      ? {
          id: last.id,
          status: last.status,
          lines: last.lines,
          timelineSrc: last.timeline_svg ? svgDataUri(last.timeline_svg) : null
        }
      : null,
    charts: chartsView(state),
    background: backgroundView(state?.background),
    reply:
      loaded && s.reply
        ? { request: s.reply.request, text: s.reply.text, error: !s.reply.ok }
        : null
  };
}
