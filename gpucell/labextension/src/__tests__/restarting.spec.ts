/**
 * A device whose engine died while a new one is started on it (issue 29): the
 * row says "restarting" in its own colour, the status bar counts it apart, and
 * the new engine goes on in the same row.
 */

import * as fs from 'fs';
import * as path from 'path';

import { DEVICE_STATES, Device, StateMessage, validate } from '../api';
import { stateTitle, statusText, viewModel } from '../view';

const fixture = JSON.parse(
  fs.readFileSync(
    path.resolve(__dirname, '../../../../tests/fixtures/panel_v1.json'),
    'utf-8'
  )
);
const states: StateMessage[] = fixture.valid.filter(
  (m: { type: string }) => m.type === 'state'
);
const RESTARTING: StateMessage = states.find(m =>
  m.cluster?.devices.some(d => d.state === 'restarting')
)!;
const DEAD: Device = states
  .flatMap(m => m.cluster?.devices ?? [])
  .find(d => d.state === 'dead')!;

const loaded = (state: StateMessage) => ({
  phase: 'loaded' as const,
  state,
  reply: null
});

/** The same cluster once the new engine (id 4) took device 1's row over. */
function backAs(engine: number): StateMessage {
  const s: StateMessage = JSON.parse(JSON.stringify(RESTARTING));
  const row = s.cluster!.devices[1];
  Object.assign(row, {
    engine,
    label: `${engine} · box · GPU 1 (A100)`,
    state: 'busy',
    color: '#2e7d32',
    util: 0.5,
    util_text: '50%'
  });
  s.seq += 1;
  s.status = 'gpucell: 4 GPUs · 1 host · 50% busy';
  return s;
}

describe('a device being restarted', () => {
  it('is a state of the schema, and an unknown state is not', () => {
    expect(DEVICE_STATES).toContain('restarting');
    expect(validate(RESTARTING)).toEqual([]);
    const odd = JSON.parse(JSON.stringify(RESTARTING));
    odd.cluster.devices[1].state = 'rebooting';
    expect(validate(odd)).toEqual([
      "cluster.devices[1].state must be one of 'idle', 'busy', 'retrying', " +
        "'restarting', 'dead', 'done', 'stopped', not \"rebooting\""
    ]);
  });

  it('is counted apart in the status bar: neither lost nor a GPU at work', () => {
    const text = statusText(loaded(RESTARTING));
    expect(text).toBe('gpucell: 3 GPUs · 1 host · 50% busy · 1 restarting');
    expect(text).not.toMatch(/dead|lost/);
  });

  it('shows its row as restarting, in a colour that is not the dead one', () => {
    const vm = viewModel(loaded(RESTARTING));
    const rows = vm.hosts[0].devices;
    expect(rows.map(d => [d.engine, d.state])).toEqual([
      [0, 'busy'],
      [1, 'restarting'],
      [2, 'busy'],
      [3, 'idle']
    ]);
    const row = rows[1];
    expect(row.color).not.toBe(DEAD.color);
    expect(row.stateTitle).toMatch(/new engine is being started/);
    expect([row.utilPct, row.memPct]).toEqual([null, null]);
    expect(row.doneText).toBe('12'); // the device's iterations so far stay
  });

  it('goes on under the new engine, in the same row', () => {
    const vm = viewModel(loaded(backAs(4)));
    expect(vm.status).toBe('gpucell: 4 GPUs · 1 host · 50% busy');
    expect(vm.hosts[0].devices.map(d => [d.engine, d.state])).toEqual([
      [0, 'busy'],
      [4, 'busy'],
      [2, 'busy'],
      [3, 'idle']
    ]);
    expect(vm.hosts[0].devices[1].stateTitle).toBe('');
  });

  it('has a tooltip that tells it from dead', () => {
    expect(stateTitle('dead')).toMatch(/nothing restarts it/);
    expect(stateTitle('restarting')).not.toBe(stateTitle('dead'));
    expect(stateTitle('idle')).toBe('');
  });
});
