'use strict'
// stampede-cache/nestjs: a NestJS dynamic module that provides one StampedeCache per module
// registration and closes it when the application shuts down.
//
// Nothing here loads @nestjs/common or @nestjs/core at import time: a dynamic module is plain data
// ({ module, providers, exports, global }) that Nest reads as it is. @nestjs/common is required
// lazily, only by InjectStampedeCache(), so the main entry and this one never pull Nest in.

const { StampedeCache, StampedeCacheError } = require('./index.js')

/** Injection token of the cache (the same instance as the `StampedeCache` class token). */
const STAMPEDE_CACHE = 'STAMPEDE_CACHE'
/** Injection token of the options the cache was built with (after forRootAsync's factory ran). */
const STAMPEDE_CACHE_OPTIONS = 'STAMPEDE_CACHE_OPTIONS'
// Closes the cache on application shutdown; an internal provider nobody injects.
const STAMPEDE_CACHE_CLOSER = 'STAMPEDE_CACHE_CLOSER'

// Module-level options; everything else goes to `new StampedeCache(...)`.
const MODULE_KEYS = ['isGlobal', 'global']

function invalid(message) {
  return new StampedeCacheError('ERR_INVALID_OPTION', message)
}

function isPlainObject(v) {
  return typeof v === 'object' && v !== null && !Array.isArray(v)
}

function splitModuleOptions(options, where) {
  if (options === undefined) return { global: false, cacheOptions: {} }
  if (!isPlainObject(options)) throw invalid(`${where}: options must be an object`)
  const cacheOptions = { ...options }
  for (const k of MODULE_KEYS) delete cacheOptions[k]
  return { global: options.isGlobal === true || options.global === true, cacheOptions }
}

// The cache provider, its string alias, and the closer. Nest instantiates every static provider at
// startup, and calls onApplicationShutdown on provider instances (factory results included) during
// app.close(): onApplicationShutdown comes after onModuleDestroy and after the HTTP server has been
// closed, so the application's own shutdown hooks can still use the cache.
function cacheProviders() {
  return [
    {
      provide: StampedeCache,
      useFactory: (options) => new StampedeCache(options),
      inject: [STAMPEDE_CACHE_OPTIONS],
    },
    { provide: STAMPEDE_CACHE, useExisting: StampedeCache },
    {
      provide: STAMPEDE_CACHE_CLOSER,
      useFactory: (cache) => ({
        onApplicationShutdown: () => cache.close(),
      }),
      inject: [StampedeCache],
    },
  ]
}

const EXPORTS = [StampedeCache, STAMPEDE_CACHE, STAMPEDE_CACHE_OPTIONS]

class StampedeCacheModule {
  /**
   * A module providing a `StampedeCache` built from `options` (the constructor's options, plus
   * `isGlobal`/`global`). The cache is closed on application shutdown.
   */
  static forRoot(options) {
    const { global, cacheOptions } = splitModuleOptions(options, 'StampedeCacheModule.forRoot')
    return {
      module: StampedeCacheModule,
      global,
      providers: [{ provide: STAMPEDE_CACHE_OPTIONS, useValue: cacheOptions }, ...cacheProviders()],
      exports: EXPORTS,
    }
  }

  /**
   * The same, with the options made by `useFactory` (which may be async) from the providers named
   * in `inject`, found in this module's `imports` or a global module.
   */
  static forRootAsync(options) {
    const where = 'StampedeCacheModule.forRootAsync'
    if (!isPlainObject(options)) throw invalid(`${where}: options must be an object`)
    const { useFactory, inject = [], imports = [] } = options
    if (typeof useFactory !== 'function') throw invalid(`${where}: \`useFactory\` must be a function`)
    if (!Array.isArray(inject)) throw invalid(`${where}: \`inject\` must be an array`)
    if (!Array.isArray(imports)) throw invalid(`${where}: \`imports\` must be an array`)
    for (const k of Object.keys(options)) {
      if (!['useFactory', 'inject', 'imports', ...MODULE_KEYS].includes(k)) throw invalid(`${where}: unknown option \`${k}\``)
    }
    return {
      module: StampedeCacheModule,
      global: options.isGlobal === true || options.global === true,
      imports,
      providers: [
        {
          provide: STAMPEDE_CACHE_OPTIONS,
          useFactory: async (...deps) => {
            const made = await useFactory(...deps)
            if (made !== undefined && !isPlainObject(made)) throw invalid(`${where}: useFactory must return an options object`)
            return made ?? {}
          },
          inject,
        },
        ...cacheProviders(),
      ],
      exports: EXPORTS,
    }
  }
}

/**
 * `@InjectStampedeCache()`: a parameter or property decorator injecting the module's cache, for
 * code without `emitDecoratorMetadata` (plain JS, or a property). Same as `@Inject(StampedeCache)`.
 */
function InjectStampedeCache() {
  const { Inject } = require('@nestjs/common')
  return Inject(StampedeCache)
}

module.exports = {
  StampedeCacheModule,
  InjectStampedeCache,
  STAMPEDE_CACHE,
  STAMPEDE_CACHE_OPTIONS,
  StampedeCache,
}
