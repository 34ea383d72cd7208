/**
 * The messages of the one Jupyter comm between the kernel and the panel.
 *
 * The TypeScript twin of `gpucell/protocol/panel.py` (schema v1).  Both sides
 * check themselves against `tests/fixtures/panel_v1.json` (pytest and jest),
 * so the two definitions cannot drift apart unseen.  Pure: no DOM, no Jupyter.
 */

/** The comm target both sides register. */
export const TARGET = 'gpucell.panel';
/** The schema version every message carries as `"v"`. */
export const VERSION = 1;
/** What the panel may ask the kernel to do. */
export const REQUESTS = ['select', 'start', 'stop', 'cancel'] as const;
export type Request = (typeof REQUESTS)[number];

export const CONNECTION_KINDS = ['local', 'ssh', 'slurm', 'connected'] as const;
export type ConnectionKind = (typeof CONNECTION_KINDS)[number];

export const RUN_STATUSES = [
  'running',
  'ok',
  'error',
  'timeout',
  'interrupted'
] as const;
export type RunStatus = (typeof RUN_STATUSES)[number];

/**
 * What a device's row may say: an engine's state, or how the last run left it.
 * `restarting`: its engine died and a new one is being started on the device
 * (the row goes on under the new engine's id); `dead`: nothing restarts it.
 */
export const DEVICE_STATES = [
  'idle',
  'busy',
  'retrying',
  'restarting',
  'dead',
  'done',
  'stopped'
] as const;
export type DeviceState = (typeof DEVICE_STATES)[number];

export interface Connection {
  kind: ConnectionKind;
  /** e.g. "4 engines on node1, node2 (profile gpucell)" */
  text: string;
  profile: string | null;
  hosts: string[];
}

export interface Device {
  engine: number;
  host: string;
  label: string;
  state: DeviceState;
  /** a CSS colour for the state */
  color: string;
  selected: boolean;
  /** fraction in [0, 1] */
  util: number | null;
  util_text: string;
  /** fraction in [0, 1] */
  mem: number | null;
  mem_text: string;
  extra: string;
  note: string;
  done_text: string;
}

export interface Cluster {
  connection: Connection;
  /** null: every engine */
  selected: number[] | null;
  devices: Device[];
}

export interface Run {
  total: number;
  done: number;
  elapsed: number;
  eta: number | null;
  status: RunStatus;
  text: string;
}

export interface Last {
  id: number;
  status: string;
  lines: string[];
  timeline_svg: string | null;
}

/** One device's points over time (the three lists are as long as each other). */
export interface HistoryDevice {
  engine: number;
  /** seconds before the last point (<= 0), oldest first */
  age: number[];
  /** percent 0-100, null: not measured then */
  util: Array<number | null>;
  /** percent 0-100, null: not measured then */
  mem: Array<number | null>;
}

/** The charts over time: the last `window` seconds, a point per `period`. */
export interface History {
  window: number;
  period: number;
  devices: HistoryDevice[];
}

/** A `--background` run not yet merged, raised or cancelled. */
export interface BackgroundPending {
  /** the `In [N]` number of its cell */
  cell: number;
  /** "running", or "finished" / "failed" (ended, waiting to be merged or raised) */
  state: string;
  done: number;
  total: number;
  /** seconds since it started (to its end once it ended) */
  elapsed: number;
  /** wall-clock start, seconds since the epoch */
  started_at: number;
  /** names its merge writes: a later cell that uses one waits for it */
  writes: string[];
  /** "cell [5]: 37 of 120 iterations (30%), 12.3 s, running" */
  text: string;
  /** what happens next once it ended ("" while it runs) */
  note: string;
}

export const BACKGROUND_OUTCOMES = ['merged', 'failed', 'cancelled'] as const;
export type BackgroundOutcome = (typeof BACKGROUND_OUTCOMES)[number];

/** A `--background` run that ended and was merged, raised or cancelled. */
export interface BackgroundRecent {
  cell: number;
  outcome: BackgroundOutcome;
  /** the error's type and first line when it failed */
  error: string | null;
  text: string;
}

export interface Background {
  /** in start order (the order they merge in) */
  pending: BackgroundPending[];
  /** newest first */
  recent: BackgroundRecent[];
}

/** Kernel -> panel: the whole state (seq grows with every state sent). */
export interface StateMessage {
  v: 1;
  type: 'state';
  seq: number;
  /** the status-bar text */
  status: string;
  cluster: Cluster | null;
  run: Run | null;
  last: Last | null;
  /** absent from a kernel older than the charts */
  history?: History | null;
  /** absent from a kernel older than `--background` */
  background?: Background | null;
}

/** Kernel -> panel: the answer to a request. */
export interface ReplyMessage {
  v: 1;
  type: 'reply';
  request: Request;
  ok: boolean;
  text: string;
}

/** Panel -> kernel: send me the whole state now. */
export interface HelloMessage {
  v: 1;
  type: 'hello';
}

/** Panel -> kernel: run later cells on these engines (null: every engine). */
export interface SelectMessage {
  v: 1;
  type: 'select';
  engines: number[] | null;
}

/** Panel -> kernel: `%gpu_cluster start ARGS`. */
export interface StartMessage {
  v: 1;
  type: 'start';
  args: string;
}

/** Panel -> kernel: `%gpu_cluster stop`. */
export interface StopMessage {
  v: 1;
  type: 'stop';
}

/** Panel -> kernel: `gpucell.runs.cell(N).cancel()`. */
export interface CancelMessage {
  v: 1;
  type: 'cancel';
  cell: number;
}

export type KernelMessage = StateMessage | ReplyMessage;
export type PanelRequest =
  HelloMessage | SelectMessage | StartMessage | StopMessage | CancelMessage;
export type Message = KernelMessage | PanelRequest;

export function hello(): HelloMessage {
  return { v: VERSION, type: 'hello' };
}

export function select(engines: number[] | null): SelectMessage {
  return { v: VERSION, type: 'select', engines };
}

export function start(args: string): StartMessage {
  return { v: VERSION, type: 'start', args };
}

export function stop(): StopMessage {
  return { v: VERSION, type: 'stop' };
}

export function cancel(cell: number): CancelMessage {
  return { v: VERSION, type: 'cancel', cell };
}

// ------------------------------------------------------------------ checks

type Obj = Record<string, unknown>;
/** a check and what the value must be */
type Check = [(x: unknown) => boolean, string];

function isObject(x: unknown): x is Obj {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

function isNum(x: unknown): x is number {
  return typeof x === 'number';
}

function isInt(x: unknown): x is number {
  return Number.isInteger(x);
}

const STR: Check = [x => typeof x === 'string', 'a string'];
const BOOL: Check = [x => typeof x === 'boolean', 'true or false'];
const INT: Check = [isInt, 'an integer'];
const NUMBER: Check = [isNum, 'a number'];
const FRACTION: Check = [
  x => isNum(x) && x >= 0 && x <= 1,
  'a number in [0, 1]'
];
const INTS: Check = [
  x => Array.isArray(x) && x.every(isInt),
  'a list of integers'
];
const STRS: Check = [
  x => Array.isArray(x) && x.every(i => typeof i === 'string'),
  'a list of strings'
];
const OBJECT: Check = [isObject, 'an object'];
const OBJECT_OR_NULL: Check = [x => x === null || isObject(x), 'an object'];
const LIST: Check = [Array.isArray, 'a list'];

function nullable(c: Check): Check {
  return [x => x === null || c[0](x), c[1] + ' or null'];
}

function oneOf(...values: readonly string[]): Check {
  return [
    x => typeof x === 'string' && values.includes(x),
    'one of ' + values.map(v => `'${v}'`).join(', ')
  ];
}

const CONNECTION: Record<string, Check> = {
  kind: oneOf(...CONNECTION_KINDS),
  text: STR,
  profile: nullable(STR),
  hosts: STRS
};
const DEVICE: Record<string, Check> = {
  engine: INT,
  host: STR,
  label: STR,
  state: oneOf(...DEVICE_STATES),
  color: STR,
  selected: BOOL,
  util: nullable(FRACTION),
  util_text: STR,
  mem: nullable(FRACTION),
  mem_text: STR,
  extra: STR,
  note: STR,
  done_text: STR
};
const RUN: Record<string, Check> = {
  total: INT,
  done: INT,
  elapsed: NUMBER,
  eta: nullable(NUMBER),
  status: oneOf(...RUN_STATUSES),
  text: STR
};
const LAST: Record<string, Check> = {
  id: INT,
  status: STR,
  lines: STRS,
  timeline_svg: nullable(STR)
};

const PERCENTS: Check = [
  x =>
    Array.isArray(x) &&
    x.every(i => i === null || (isNum(i) && i >= 0 && i <= 100)),
  'a list of numbers in [0, 100] or nulls'
];
const HISTORY_DEVICE: Record<string, Check> = {
  engine: INT,
  age: [
    x => Array.isArray(x) && x.every(i => isNum(i) && i <= 0),
    'a list of numbers <= 0'
  ],
  util: PERCENTS,
  mem: PERCENTS
};
const BACKGROUND_PENDING: Record<string, Check> = {
  cell: INT,
  state: STR,
  done: INT,
  total: INT,
  elapsed: NUMBER,
  started_at: NUMBER,
  writes: STRS,
  text: STR,
  note: STR
};
const BACKGROUND_RECENT: Record<string, Check> = {
  cell: INT,
  outcome: oneOf(...BACKGROUND_OUTCOMES),
  error: nullable(STR),
  text: STR
};
const POSITIVE: Check = [x => isNum(x) && x > 0, 'a number > 0'];

function repr(x: unknown): string {
  try {
    return JSON.stringify(x) ?? String(x);
  } catch {
    return String(x);
  }
}

function fields(
  obj: unknown,
  spec: Record<string, Check>,
  where: string
): string[] {
  if (!isObject(obj)) {
    return [`${where} must be an object`];
  }
  const problems: string[] = [];
  for (const [key, [ok, what]] of Object.entries(spec)) {
    if (!Object.prototype.hasOwnProperty.call(obj, key)) {
      problems.push(`${where}.${key} is missing`);
    } else if (!ok(obj[key])) {
      problems.push(`${where}.${key} must be ${what}, not ${repr(obj[key])}`);
    }
  }
  return problems;
}

function cluster(c: unknown): string[] {
  const problems = fields(
    c,
    { connection: OBJECT, selected: nullable(INTS), devices: LIST },
    'cluster'
  );
  if (problems.length) {
    return problems;
  }
  const obj = c as Obj;
  problems.push(...fields(obj.connection, CONNECTION, 'cluster.connection'));
  (obj.devices as unknown[]).forEach((d, i) => {
    problems.push(...fields(d, DEVICE, `cluster.devices[${i}]`));
  });
  return problems;
}

function history(h: unknown): string[] {
  const problems = fields(
    h,
    { window: POSITIVE, period: POSITIVE, devices: LIST },
    'history'
  );
  if (problems.length) {
    return problems;
  }
  ((h as Obj).devices as unknown[]).forEach((d, i) => {
    const where = `history.devices[${i}]`;
    const found = fields(d, HISTORY_DEVICE, where);
    const dev = d as HistoryDevice;
    if (
      !found.length &&
      !(dev.age.length === dev.util.length && dev.age.length === dev.mem.length)
    ) {
      found.push(`${where}: age, util and mem must be as long as each other`);
    }
    problems.push(...found);
  });
  return problems;
}

function background(b: unknown): string[] {
  const problems = fields(b, { pending: LIST, recent: LIST }, 'background');
  if (problems.length) {
    return problems;
  }
  const obj = b as Obj;
  (obj.pending as unknown[]).forEach((r, i) => {
    problems.push(...fields(r, BACKGROUND_PENDING, `background.pending[${i}]`));
  });
  (obj.recent as unknown[]).forEach((r, i) => {
    problems.push(...fields(r, BACKGROUND_RECENT, `background.recent[${i}]`));
  });
  return problems;
}

/**
 * What is wrong with `msg` as a panel message (`[]`: nothing).
 *
 * Unknown extra keys are allowed (a newer kernel may add some); missing keys,
 * wrong types, another version or an unknown type are not.  Mirrors
 * `gpucell.protocol.panel.validate` rule for rule.
 */
export function validate(msg: unknown): string[] {
  if (!isObject(msg)) {
    return ['a message must be a JSON object'];
  }
  // strict: a boolean `true` is not the version 1 (booleans are not numbers)
  if (!(isInt(msg.v) && msg.v === VERSION)) {
    return [`v must be ${VERSION}, not ${repr(msg.v)}`];
  }
  const kind = msg.type;
  switch (kind) {
    case 'state': {
      const problems = fields(
        msg,
        {
          seq: INT,
          status: STR,
          cluster: OBJECT_OR_NULL,
          run: OBJECT_OR_NULL,
          last: OBJECT_OR_NULL
        },
        'state'
      );
      if (problems.length) {
        return problems;
      }
      if (msg.cluster !== null) {
        problems.push(...cluster(msg.cluster));
      }
      if (msg.run !== null) {
        problems.push(...fields(msg.run, RUN, 'run'));
      }
      if (msg.last !== null) {
        problems.push(...fields(msg.last, LAST, 'last'));
      }
      if (msg.history !== undefined && msg.history !== null) {
        problems.push(...history(msg.history));
      }
      if (msg.background !== undefined && msg.background !== null) {
        problems.push(...background(msg.background));
      }
      return problems;
    }
    case 'reply':
      return fields(
        msg,
        { request: oneOf(...REQUESTS), ok: BOOL, text: STR },
        'reply'
      );
    case 'hello':
      return [];
    case 'select':
      return fields(msg, { engines: nullable(INTS) }, 'select');
    case 'start':
      return fields(msg, { args: STR }, 'start');
    case 'stop':
      return [];
    case 'cancel':
      return fields(msg, { cell: INT }, 'cancel');
    default:
      return [
        'type must be one of state, reply, hello, select, start, stop, ' +
          `cancel, not ${repr(kind)}`
      ];
  }
}

/** `msg` as a typed message if it is a valid one, else null. */
export function parse(msg: unknown): Message | null {
  return validate(msg).length ? null : (msg as unknown as Message);
}
