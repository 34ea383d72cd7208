/**
 * Pure-TypeScript unit tests (no browser, no jsdom): ts-jest compiles
 * src/__tests__/*.spec.ts with tsconfig.test.json.
 */
module.exports = {
  preset: 'ts-jest',
  testEnvironment: 'node',
  testMatch: ['**/src/__tests__/**/*.spec.ts'],
  transform: {
    '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }]
  }
};
