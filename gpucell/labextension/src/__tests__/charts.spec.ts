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
  chartSpan,
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
    // 2 s of history: the axis spans 5 s, not the 5-minute window
    expect(v.title).toBe('last 5 s (of 5 min)');
    expect(v.span).toBe(5);
    expect(v.util.src.startsWith('data:image/svg+xml;base64,')).toBe(true);
    expect(v.mem.points).toBe(3);
    expect(v.legend[0].label).toBe(FULL.cluster!.devices[0].label);
  });
});

describe('chartSpan: the x axis spans what exists until the window fills', () => {
  const hist = (ages: number[][], window = 300): History => ({
    window,
    period: 1,
    devices: ages.map((age, i) => ({
      engine: i,
      age,
      util: age.map(() => 50),
      mem: age.map(() => 10)
    }))
  });
  const ramp = (n: number) => Array.from({ length: n }, (_, i) => i - n + 1);

  it('rounds what exists up to 5 s under a minute, 15 s under two, 30 s beyond', () => {
    expect(chartSpan(hist([[]]))).toBe(5);
    expect(chartSpan(hist([[0]]))).toBe(5);
    expect(chartSpan(hist([ramp(5)]))).toBe(5); // oldest -4 s
    expect(chartSpan(hist([ramp(11)]))).toBe(10); // oldest -10 s: exactly
    expect(chartSpan(hist([ramp(12)]))).toBe(15);
    expect(chartSpan(hist([ramp(61)]))).toBe(60);
    expect(chartSpan(hist([ramp(62)]))).toBe(75);
    expect(chartSpan(hist([ramp(122)]))).toBe(150);
    // the longest device's history decides; the window caps it
    expect(chartSpan(hist([ramp(3), ramp(40)]))).toBe(40);
    expect(chartSpan(hist([ramp(400)]))).toBe(300);
    expect(chartSpan(hist([ramp(50)], 30))).toBe(30);
  });

  it('draws the first seconds across most of the width, the span labelled', () => {
    // 12 s of history (13 points): a 15 s axis, the line from x >= 30 + 0.2 * 264
    const h = hist([ramp(13)]);
    const c = historyCharts(h, new Map());
    expect(c.span).toBe(15);
    const [line] = polylines(c.util.svg);
    const xs = line.map(p => Number(p.split(',')[0]));
    const width = 300 - 30 - 6;
    expect(Math.max(...xs)).toBeCloseTo(30 + width, 1);
    expect(Math.min(...xs)).toBeLessThanOrEqual(30 + 0.25 * width);
    expect(c.util.svg).toContain('>-15 s<');
    // with the 5-minute axis the same points took the last 4 % of the width
    const fixed = chartSvg({
      title: 't',
      window: 300,
      series: [
        {
          engine: 0,
          name: 'e',
          color: '#000',
          age: ramp(13),
          values: ramp(13).map(() => 5)
        }
      ]
    });
    const xf = polylines(fixed.svg)[0].map(p => Number(p.split(',')[0]));
    expect(Math.min(...xf)).toBeGreaterThan(30 + 0.95 * width);
  });

  it('says the full window once the history spans it', () => {
    const state = { ...FULL, history: hist([ramp(400)]) } as StateMessage;
    const v = chartsView(state)!;
    expect(v.title).toBe('last 5 min');
    expect(v.span).toBe(300);
  });
});
