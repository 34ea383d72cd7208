/**
 * The charts over time: SVG text from the state's history.
 */

import * as fs from 'fs';
import * as path from 'path';

import { History, StateMessage, validate } from '../api';
import {
  PALETTE,
  chartSvg,
  escapeXml,
  historyCharts,
  runs,
  seriesColor,
  spanText
} from '../charts';
import { chartsView } from '../view';

const fixture = JSON.parse(
  fs.readFileSync(
    path.resolve(__dirname, '../../../../tests/fixtures/panel_v1.json'),
    'utf-8'
  )
);
const FULL: StateMessage = fixture.valid[1];
const WITH_HISTORY: StateMessage = fixture.valid.find(
  (m: StateMessage) => m.type === 'state' && m.history
);

function polylines(svg: string): string[][] {
  return [...svg.matchAll(/<polyline points="([^"]*)"/g)].map(m =>
    m[1].split(' ')
  );
}

describe('runs', () => {
  it('breaks the line where a point was not measured', () => {
    expect(runs([-3, -2, -1, 0], [1, null, 3, 4])).toEqual([
      [[-3, 1]],
      [
        [-1, 3],
        [0, 4]
      ]
    ]);
    expect(runs([], [])).toEqual([]);
    expect(runs([-1, 0], [null, null])).toEqual([]);
  });
});

describe('chartSvg', () => {
  it('draws one polyline per measured run, x from age, y from percent', () => {
    const c = chartSvg({
      title: 'Utilisation',
      window: 300,
      width: 300,
      height: 120,
      series: [
        {
          engine: 0,
          name: 'gpu0',
          color: '#123456',
          age: [-300, -150, 0],
          values: [0, 50, 100]
        }
      ]
    });
    expect(c.points).toBe(3);
    const [line] = polylines(c.svg);
    // left 30, right 6: plot 264 wide; top 18, bottom 16: plot 86 high
    expect(line).toEqual(['30.0,104.0', '162.0,61.0', '294.0,18.0']);
    expect(c.svg).toContain('stroke="#123456"');
    expect(c.svg).toContain('-5 min');
    expect(c.svg).toContain('>now<');
    expect(c.svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).toBe(
      true
    );
  });

  it('clamps values and ages outside the chart', () => {
    const c = chartSvg({
      title: 't',
      window: 10,
      series: [
        {
          engine: 0,
          name: 'x',
          color: '#000',
          age: [-50, 0],
          values: [-5, 250]
        }
      ]
    });
    const [line] = polylines(c.svg);
    expect(line).toEqual(['30.0,104.0', '294.0,18.0']);
  });

  it('shows a lone point as a dot, and says when nothing was measured', () => {
    const dot = chartSvg({
      title: 't',
      window: 60,
      series: [{ engine: 0, name: 'x', color: '#000', age: [0], values: [5] }]
    });
    expect(dot.points).toBe(1);
    expect(dot.svg).toContain('<circle');
    const none = chartSvg({
      title: 't',
      window: 60,
      series: [
        { engine: 0, name: 'x', color: '#000', age: [0], values: [null] }
      ]
    });
    expect(none.points).toBe(0);
    expect(none.svg).toContain('not measured yet');
  });

  it('escapes text', () => {
    expect(escapeXml('<a & "b">')).toBe('&lt;a &amp; &quot;b&quot;&gt;');
    const c = chartSvg({ title: '<script>', window: 60, series: [] });
    expect(c.svg).not.toContain('<script>');
  });

  it('names the span', () => {
    expect(spanText(300)).toBe('5 min');
    expect(spanText(90)).toBe('90 s');
  });
});

describe('historyCharts and chartsView', () => {
  it('the fixture history is valid and drawn with one colour per device', () => {
    expect(validate(WITH_HISTORY)).toEqual([]);
    const h = WITH_HISTORY.history as History;
    const c = historyCharts(h, new Map([[0, 'gpu zero']]));
    expect(c.legend).toEqual([
      { engine: 0, label: 'gpu zero', color: PALETTE[0] },
      { engine: 1, label: 'engine 1', color: PALETTE[1] }
    ]);
    // util [10.5, null, 100]: a dot and a dot; mem: a 3-point line
    expect(c.util.points).toBe(2);
    expect(c.mem.points).toBe(3);
    expect(seriesColor(PALETTE.length + 1)).toBe(PALETTE[1]);
  });

  it('is null without a cluster or a history, images with one', () => {
    expect(chartsView(null)).toBeNull();
    expect(chartsView(WITH_HISTORY)).toBeNull(); // its cluster is null
    expect(chartsView(FULL)).toBeNull(); // no history
    const both = { ...FULL, history: WITH_HISTORY.history };
    const v = chartsView(both)!;
    expect(v.title).toBe('last 5 min');
    expect(v.util.src.startsWith('data:image/svg+xml;base64,')).toBe(true);
    expect(v.mem.points).toBe(3);
    expect(v.legend[0].label).toBe(FULL.cluster!.devices[0].label);
  });
});
