/**
 * The TypeScript schema against the fixture pytest also checks
 * (tests/fixtures/panel_v1.json): every valid message passes, every invalid
 * one is rejected, and the constants agree.
 */

import * as fs from 'fs';
import * as path from 'path';

import {
  TARGET,
  VERSION,
  cancel,
  hello,
  parse,
  select,
  start,
  stop,
  validate
} from '../api';

interface Fixture {
  target: string;
  version: number;
  valid: unknown[];
  invalid: Array<{ why: string; message: unknown }>;
}

const FIXTURE = path.resolve(
  __dirname,
  '../../../../tests/fixtures/panel_v1.json'
);
const fixture: Fixture = JSON.parse(fs.readFileSync(FIXTURE, 'utf-8'));

describe('the panel schema (v1)', () => {
  it('has the fixture’s target and version', () => {
    expect(TARGET).toBe(fixture.target);
    expect(VERSION).toBe(fixture.version);
    expect(fixture.valid.length).toBeGreaterThan(5);
    expect(fixture.invalid.length).toBeGreaterThan(5);
  });

  it.each(fixture.valid.map(m => [(m as { type: string }).type, m]))(
    'accepts a valid %s message',
    (_type, msg) => {
      expect(validate(msg)).toEqual([]);
      expect(parse(msg)).toBe(msg);
    }
  );

  it.each(fixture.invalid.map(c => [c.why, c.message]))(
    'rejects %s',
    (_why, msg) => {
      const problems = validate(msg);
      expect(problems.length).toBeGreaterThan(0);
      problems.forEach(p => expect(typeof p).toBe('string'));
      expect(parse(msg)).toBeNull();
    }
  );

  it('builds valid requests', () => {
    for (const m of [
      hello(),
      select([0, 2]),
      select(null),
      start('-n 2'),
      stop(),
      cancel(5)
    ]) {
      expect(validate(m)).toEqual([]);
    }
  });

  const state = () =>
    JSON.parse(JSON.stringify(fixture.valid[1])) as Record<string, any>;

  it('says what is wrong, as the Python side does', () => {
    const s = state();
    delete s.status;
    expect(validate(s)).toEqual(['state.status is missing']);
    const t = state();
    t.cluster.devices[0].util = 1.5;
    expect(validate(t)).toEqual([
      'cluster.devices[0].util must be a number in [0, 1] or null, not 1.5'
    ]);
    expect(validate({ v: 1, type: 'restart' })).toEqual([
      'type must be one of state, reply, hello, select, start, stop, cancel, not "restart"'
    ]);
    expect(validate(null)).toEqual(['a message must be a JSON object']);
    expect(validate('{"v": 1}')).toEqual(['a message must be a JSON object']);
  });

  it('does not take booleans for numbers nor floats for integers', () => {
    expect(validate({ v: true, type: 'hello' })).not.toEqual([]);
    expect(validate({ v: 1, type: 'select', engines: [true] })).not.toEqual([]);
    expect(validate({ v: 1, type: 'select', engines: [0.5] })).not.toEqual([]);
    const s = state();
    s.seq = true;
    expect(validate(s)).not.toEqual([]);
    const r = state();
    r.run.elapsed = false;
    expect(validate(r)).not.toEqual([]);
    const d = state();
    d.cluster.devices[0].util = true;
    expect(validate(d)).not.toEqual([]);
  });

  it('takes fractions at both ends and null, and nothing outside', () => {
    for (const [util, ok] of [
      [0, true],
      [1, true],
      [null, true],
      [-0.01, false],
      [1.01, false],
      ['0.5', false]
    ] as const) {
      const s = state();
      s.cluster.devices[0].mem = util;
      expect(validate(s).length === 0).toBe(ok);
    }
  });

  it('lets extra keys through everywhere', () => {
    const s = state();
    s.extra = 1;
    s.cluster.extra = 1;
    s.cluster.connection.extra = 1;
    s.cluster.devices[0].extra2 = 1;
    s.run.extra = 1;
    s.last.extra = 1;
    expect(validate(s)).toEqual([]);
  });

  it('checks cluster, run and last only when not null, and objects when not', () => {
    const s = state();
    s.cluster = [];
    expect(validate(s)).toEqual(['state.cluster must be an object, not []']);
    const t = state();
    t.cluster.devices = {};
    expect(validate(t)).toEqual(['cluster.devices must be a list, not {}']);
    const u = state();
    u.cluster.devices = [1];
    expect(validate(u)).toEqual(['cluster.devices[0] must be an object']);
  });
});
